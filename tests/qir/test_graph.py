"""The QIR container: mutators keep records and edges in sync, clones are independent."""
from __future__ import annotations

import numpy as np
import pytest

from qir import QIR, CalibMode, CalibRole, NodeKind, verify
from qir.errors import NotFoundError, QirError


def small_ir() -> QIR:
    """x ─┬─ Mul(x, x) ─ m ─ Add(m, @b) ─ y
          └─────────────────────────────── (x read twice by one op)"""
    ir = QIR("small")
    ir.add_input("x", "float32", (1, 4))
    ir.add_weight("b", np.arange(4, dtype=np.float32))
    ir.add_op("mul", "Mul", ["x", "x"], ["m"], output_info={"m": ("float32", (1, 4))})
    ir.add_op("add", "Add", ["m", "b"], ["y"], output_info={"y": ("float32", (1, 4))})
    ir.set_outputs(["y"])
    return ir


def test_same_value_in_two_slots_is_two_edges():
    ir = small_ir()
    assert verify(ir) == []
    assert [(r.name, s) for r, s in ir.uses("x")] == [("mul", 0), ("mul", 1)]
    assert ir.graph.number_of_edges("%x", "mul") == 2


def test_lookup_suggests_close_names():
    ir = small_ir()
    with pytest.raises(NotFoundError, match="did you mean 'mul'"):
        ir.node("mull")
    with pytest.raises(NotFoundError, match="did you mean 'b'"):
        ir.value("bb")
    assert ir.producer("y").name == "add"
    assert ir.producer("x") is None


def test_weights_are_read_only_and_shared_by_clones():
    ir = small_ir()
    w = ir.weight_array("b")
    with pytest.raises(ValueError):
        w[0] = 5
    clone = ir.clone()
    assert clone.weight_array("b") is w
    clone.set_weight("b", np.ones(4, np.float32))
    assert ir.weight_array("b")[0] == 0 and clone.weight_array("b")[0] == 1


def test_clone_is_independent():
    ir = small_ir()
    before = str(ir)
    clone = ir.clone()
    clone.insert_calibration("m", "m.cal", threshold=1.0)
    clone.op("add").attrs["foo"] = 1
    assert str(ir) == before
    assert verify(clone) == []
    assert clone.calibration("m.cal").feeds == ("add",)


def test_insert_calibration_rewires_chosen_uses_and_keeps_order():
    ir = small_ir()
    rec = ir.insert_calibration("x", "x.cal", uses=[("mul", 1)], mode="int16", threshold=2.0)
    assert rec.role is CalibRole.ACTIVATION and rec.mode is CalibMode.INT16
    assert ir.op("mul").inputs == ("x", "x~q")
    wcal = ir.insert_calibration("b", "b.cal")
    assert wcal.role is CalibRole.WEIGHT
    names = [r.name for r in ir.runnables()]
    # a weight's calibration sits right before its reader; an input's before its first reader
    assert names == ["x.cal", "mul", "b.cal", "add"]
    assert verify(ir) == []
    assert ir.counts() == {"general": 2, "calibration": 2, "weight": 1, "activation": 5}


def test_replace_uses_and_remove_node():
    ir = small_ir()
    ir.add_op("relu", "Relu", ["m"], ["r"], after="mul")
    assert ir.replace_uses("m", "r", skip=["relu"]) == 1
    assert ir.op("relu").inputs == ("m",) and ir.op("add").inputs == ("r", "b")
    assert [r.name for r in ir.runnables()] == ["mul", "relu", "add"]
    assert verify(ir) == []
    with pytest.raises(QirError, match="still used"):
        ir.remove_node("relu")
    ir.replace_uses("r", "m")
    ir.remove_node("relu")
    assert verify(ir) == [] and not ir.has_value("r")


def test_prune_removes_dead_branches_and_unused_weights():
    ir = small_ir()
    ir.add_weight("unused", np.zeros(3, np.float32))
    ir.add_op("dead", "Neg", ["m"], ["d"])
    assert ir.prune() == 3  # op, its output, the weight
    assert verify(ir) == [] and not ir.has_node("dead")


def test_duplicate_names_are_rejected():
    ir = small_ir()
    with pytest.raises(QirError, match="already exists"):
        ir.add_op("mul", "Neg", ["x"], ["z"])
    with pytest.raises(QirError, match="SSA"):
        ir.add_op("neg", "Neg", ["x"], ["m"])


def test_verify_reports_broken_invariants():
    ir = small_ir()
    ir.graph.remove_edge("%m", "add", key=0)           # record says slot 0 reads m
    ir.value("b").kind = NodeKind.ACTIVATION            # a constant with no producer
    problems = verify(ir)
    assert any("input edges" in p and "'add'" in p for p in problems)
    assert any("activation 'b' has 0 producers" in p for p in problems)


def test_topological_order_is_deterministic_and_cached():
    ir = small_ir()
    first = [r.name for r in ir.runnables()]
    version = ir.version
    assert [r.name for r in ir.runnables()] == first == ["mul", "add"]
    ir.add_op("neg", "Neg", ["y"], ["z"])
    assert ir.version > version
    assert [r.name for r in ir.runnables()] == ["mul", "add", "neg"]
