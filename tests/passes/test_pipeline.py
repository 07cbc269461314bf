"""Pass infrastructure: pipeline strings, the pass contract, PassManager dumps/verification."""
from __future__ import annotations

import pytest

import qir
from qir.errors import NotFoundError, QirError
from qir.passes import PassManager, get_pass, parse_pipeline
from qir.passes.base import AnalysisPass, PassError, PassResult

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits" / "model.onnx"


def test_parse_pipeline_literals_and_plain_strings():
    assert parse_pipeline("fold-bn, fuse{march=nash-e},calibrate{method='kl',percentile=99.9,limit=4}") == [
        ("fold-bn", {}), ("fuse", {"march": "nash-e"}),
        ("calibrate", {"method": "kl", "percentile": 99.9, "limit": 4})]
    assert parse_pipeline("set-mode{nodes=['a','b'],mode=int16}") == [
        ("set-mode", {"nodes": ["a", "b"], "mode": "int16"})]
    assert parse_pipeline("set-mode{nodes='conv2,/m.22/*',mode=int16},emit{path='a,b.onnx'}") == [
        ("set-mode", {"nodes": "conv2,/m.22/*", "mode": "int16"}), ("emit", {"path": "a,b.onnx"})]
    for bad, message in [("a{b=1", "unbalanced brackets"), ("a{b}", "key=value"), ("", "empty"),
                         ("a}", "unbalanced"), ("a{b='x}", "unbalanced quotes")]:
        with pytest.raises(QirError, match=message):
            parse_pipeline(bad)


def test_unknown_pass_and_option_are_explained():
    with pytest.raises(NotFoundError, match="did you mean 'fold-bn'"):
        get_pass("fold-nb")
    with pytest.raises(QirError, match="has no option 'marhc'; its options are march"):
        get_pass("fuse", marhc="nash-e")
    with pytest.raises(QirError, match="pass 'fuse': no march profile named 'nash-x'; did you mean 'nash-e'"):
        get_pass("fuse", march="nash-x")


def test_manager_dumps_after_each_pass(tmp_path):
    ir = qir.load(DIGITS)
    result = PassManager("fold-bn,fuse{march=nash-e},insert-calibration", dump_dir=tmp_path).run(ir)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["000_input.qir.txt", "001_fold-bn.qir.txt", "002_fuse.qir.txt",
                     "003_insert-calibration.qir.txt"]
    assert (tmp_path / "001_fold-bn.qir.txt").read_text().startswith("# IR after fold-bn (modified)\nqir ")
    assert "BatchNormalization" in (tmp_path / "000_input.qir.txt").read_text()
    assert "BatchNormalization" not in (tmp_path / "001_fold-bn.qir.txt").read_text()
    assert set(result.report["passes"]) == {"fold-bn", "fuse", "insert-calibration"}
    assert result.modified and qir.verify(ir) == []


class _Sneaky(AnalysisPass):
    name = "sneaky"

    def run(self, ir):
        ir.touch()  # an analysis must not change what it analyses
        return PassResult(ir, False)


class _Breaker(AnalysisPass):
    name = "breaker"

    def run(self, ir):
        return PassResult(ir, False)


def test_contract_violations_and_failures_name_the_pass():
    ir = qir.load(DIGITS)
    with pytest.raises(PassError, match="analysis pass 'sneaky' changed the IR"):
        _Sneaky()(ir)
    ir.graph.remove_edge("%relu1_out", "conv2", key=0)  # break an invariant behind the IR's back
    with pytest.raises(PassError, match="invalid after pass 'breaker'.*conv2"):
        PassManager([_Breaker()]).run(ir)
    with pytest.raises(PassError, match="pass 'set-mode' failed \\(after fold-bn\\).*has no calibration nodes"):
        PassManager("fold-bn,set-mode{nodes=nope,mode=int16}").run(qir.load(DIGITS))
