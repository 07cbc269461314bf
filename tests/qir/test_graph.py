"""The QIR container: mutators keep records and edges in sync, clones are independent."""
from __future__ import annotations

import numpy as np
import pytest

import qir
from qir import QIR, CalibMode, CalibRole, NodeKind, verify
from qir.errors import NotFoundError, QirError
from qir.passes import PassManager
from qir.records import ValueRecord

from ..conftest import REPO


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


def test_topological_order_is_networkx_lexicographical_order():
    import networkx as nx

    from qir.graph import _topological_keys

    ir = qir.load(REPO / "qir" / "examples" / "digits" / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    for model in (small_ir(), ir):  # Mul(x, x): parallel edges; calibration nodes: inserted ordinals
        ords = nx.get_node_attributes(model.graph, "ord")
        assert _topological_keys(model.graph) == list(nx.lexicographical_topological_sort(
            model.graph, key=lambda k: ords[k]))
    ir.graph.add_edge("%" + ir.outputs[0], ir.runnables()[0].name, key=9)  # a cycle
    with pytest.raises(QirError, match="cycle"):
        _topological_keys(ir.graph)


def test_omitted_optional_outputs_create_no_value():
    ir = QIR("opt")
    ir.add_input("x", "float32", (2,))
    ir.add_op("d1", "Dropout", ["x"], ["a", ""])
    ir.add_op("d2", "Dropout", ["a"], ["b", ""])  # a second "" must not collide
    ir.set_outputs(["b"])
    assert verify(ir) == [] and not ir.has_value("")
    assert "d1: %a : ?[*], _ = Dropout(%x)" in str(ir)
    ir.add_op("n", "Neg", ["b"], ["c"])
    ir.set_outputs(["c"])
    ir.replace_uses("b", "a", skip=["n"])
    assert ir.prune() == 0 or verify(ir) == []


def test_failed_mutations_leave_the_ir_unchanged():
    ir = small_ir()
    ir.insert_calibration("m", "cal1", threshold=1.0)
    before = str(ir)
    with pytest.raises(QirError, match="'m~q' already exists"):
        ir.insert_calibration("m", "cal2", threshold=1.0)   # default output name collides
    with pytest.raises(QirError, match="'y' already exists"):
        ir.add_op("n2", "Split", ["x"], ["z", "y"])
    assert str(ir) == before and verify(ir) == [] and not ir.has_node("cal2") and not ir.has_value("z")


def test_insert_calibration_checks_the_uses_it_is_given():
    ir = small_ir()
    with pytest.raises(QirError, match="it reads 'b', not 'm'"):
        ir.insert_calibration("m", "c", uses=[("add", 1)])
    with pytest.raises(NotFoundError, match="did you mean 'add'"):
        ir.insert_calibration("m", "c", uses=[("addd", 0)])
    assert verify(ir) == [] and not ir.has_node("c")


def test_prune_keeps_every_output_of_a_surviving_node():
    ir = QIR("split")
    ir.add_input("x", "float32", (4,))
    ir.add_weight("sizes", np.array([2, 2], np.int64))
    ir.add_op("s", "Split", ["x", "sizes"], ["a", "b"])
    ir.set_outputs(["a"])
    assert ir.prune() == 0
    assert verify(ir) == [] and ir.has_value("b")


def test_clones_do_not_share_calibration_arrays_or_ordinals():
    ir = small_ir()
    ir.insert_calibration("b", "b.cal", axis=0, threshold=np.array([1, 2, 3, 4], np.float32))
    clone = ir.clone()
    clone.calibration("b.cal").threshold[0] = 99
    assert ir.calibration("b.cal").threshold[0] == 1
    a = ir.insert_calibration("m", "m.cal")
    b = clone.insert_calibration("m", "m.cal")
    assert ir.graph.nodes[a.name]["ord"] == clone.graph.nodes[b.name]["ord"]
    running = [d["ord"] for _, d in clone.graph.nodes(data=True) if not isinstance(d["rec"], ValueRecord)]
    assert len(set(running)) == len(running)


def test_graph_inputs_and_outputs_change_only_through_mutators():
    ir = small_ir()
    with pytest.raises(AttributeError):
        ir.outputs.append("m")  # a tuple: no silent edits behind the caches' back
    version = ir.version
    ir.set_outputs(["y", "m"])
    assert ir.outputs == ("y", "m") and ir.version > version


def test_set_calibration_is_the_one_way_to_change_a_node_and_moves_the_version():
    ir = small_ir()
    ir.insert_calibration("x", "x_q", role="activation")
    v = ir.version
    assert ir.set_calibration("x_q", mode="int8") is False and ir.version == v  # already int8
    assert ir.set_calibration("x_q", threshold=np.float32(2.0)) and ir.version > v
    rec = ir.calibration("x_q")
    assert rec.threshold == np.float32(2.0) and rec.scale is None and not rec.fixed
    v = ir.version
    assert ir.set_calibration("x_q", threshold=np.float32(2.0)) is False and ir.version == v
    # an imported scale keeps its range across int8 -> int16 (s' = s * 127 / 32767)
    rec.scale, rec.threshold = np.float32(0.5), None
    assert ir.set_calibration("x_q", mode=CalibMode.INT16) and rec.mode is CalibMode.INT16
    assert float(rec.scale) == pytest.approx(0.5 * 127 / 32767)
    # a user threshold drops the imported scale and is marked fixed
    assert ir.set_calibration("x_q", threshold=np.float32(3.0), axis=None, fixed=True)
    assert rec.scale is None and rec.fixed and rec.axis is None
    with pytest.raises(NotFoundError):
        ir.set_calibration("nope", mode="int8")


@pytest.mark.parametrize("first, second", [("int16", "float"), ("float", "int16"), ("int8", "fp16"), ("fp16", "int8")])
def test_every_mode_change_moves_the_version(first, second):
    # the mode values of equal length (int16/float, int8/fp16) once compared equal through numpy
    ir = small_ir()
    ir.insert_calibration("x", "x_q", role="activation")
    ir.set_calibration("x_q", mode=first)
    v = ir.version
    assert ir.set_calibration("x_q", mode=second) and ir.version > v
    assert ir.calibration("x_q").mode is CalibMode(second)
