"""ONNX's own node test suite (``onnx.backend.test.case.node.collect_testcases()``: single-op
models with inputs and the outputs ONNX's reference computes) through :mod:`qir.backend`, on
both runtimes.

The rules (issue 38):

* Every case either passes (outputs as ONNX's ``Runner.assert_similar_outputs`` compares them,
  with the case's rtol/atol) or is refused by qir in ``prepare``, before anything runs, with one
  of its own errors. A wrong answer, an error while running or any other exception fails.
* A refused case outside the excluded families (:data:`EXCLUDED`) must be refused clearly: an
  :class:`UnsupportedOpError` / :class:`ImportError_` (or onnxruntime declining to load it, an
  :class:`ExecutionError` from ``prepare``) whose message names an op type or a value of the model
  (or, refusing a whole model as too old, its opset).
* Every non-expanded case of the ops in :data:`MUST_PASS` passes on both runtimes, except the
  refusals :data:`MAY_REFUSE` lists with their reasons.
* Every attribute of an imported model comes back from qir's export with its type and value.

The pass / refused counts per runtime are printed at the end of the run (``tests/qir/conftest.py``
reads them from each test's ``user_properties``).
"""
from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import onnx
import pytest

from qir.backend import backend_for
from qir.errors import ExecutionError, ImportError_, QirError, UnsupportedOpError

RUNTIMES = ("numpy", "ort")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the suite feeds inf/NaN on purpose

# Op families qir does not claim: an NPU toolkit need not run them. Their cases still run and
# must pass or be refused by qir (never a wrong answer); a refusal needs no further check.
EXCLUDED: dict[str, tuple[str, frozenset[str]]] = {
    "control flow": ("If/Loop/Scan hold subgraphs, which the IR cannot represent; NPU models are exported "
                     "with static control flow", frozenset({"If", "Loop", "Scan", "SequenceMap"})),
    "sequences and optionals": ("the IR's values are tensors; sequences and optional values are host-side "
                                "data structures", frozenset({
                                    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
                                    "SequenceInsert", "SequenceLength", "SplitToSequence", "ConcatFromSequence",
                                    "Optional", "OptionalGetElement", "OptionalHasElement"})),
    "strings and text": ("NPUs compute on numbers; text processing runs on the host",
                         frozenset({"StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch",
                                    "TfIdfVectorizer"})),
    "losses and training": ("training-only ops: qir analyses inference models", frozenset({
        "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "Adagrad", "Adam", "Momentum", "Gradient"})),
    "recurrent networks": ("RNN/GRU/LSTM cells are lowered to matrix products before an NPU sees them; qir's "
                           "numpy runtime has no kernels for them", frozenset({"RNN", "GRU", "LSTM"})),
    "signal processing": ("FFTs and spectral windows are not NPU ops (and onnxruntime's DFT/STFT differ from "
                          "ONNX's reference beyond the suite's tolerance near zero)",
                          frozenset({"DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow",
                                     "MelWeightMatrix"})),
    "random numbers": ("random generators cannot reproduce ONNX's expected outputs", frozenset({
        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"})),
    "image decoding": ("decoding image files is host-side preprocessing", frozenset({"ImageDecoder"})),
    "fused LLM operators (opset 23+)": ("the numpy runtime has no kernels for them; onnxruntime runs Attention "
                                        "except where its fused kernel departs from ONNX's reference (causal masks "
                                        "over past keys or in float16, nonpad_kv_seqlen beside a mask), which qir "
                                        "refuses", frozenset({"Attention", "FlexAttention", "LinearAttention",
                                                              "CausalConvWithState"})),
    "training-mode Dropout and MaxUnpool": ("random masks cannot match ONNX's reference; onnxruntime's "
                                            "MaxUnpool with output_shape places values differently",
                                            frozenset({"MaxUnpool"})),
    "classical ML (ai.onnx.ml)": ("tree ensembles, scalers, label encoders and the like: not neural-network "
                                  "layers; qir reads models with the default ONNX domain", frozenset()),
    "standalone integer quantization": ("QuantizeLinear/DequantizeLinear/QLinear*/*Integer whose integer "
                                        "tensors are graph inputs or outputs: the IR's calibration nodes are "
                                        "fake quantization (float in, float out)", frozenset({
                                            "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                                            "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"})),
}

MUST_PASS = frozenset("""
Conv ConvTranspose MatMul Gemm Add Sub Mul Div Pow Sqrt Exp Erf Relu Clip Sigmoid HardSigmoid HardSwish
LeakyRelu PRelu Tanh Gelu Softmax LayerNormalization BatchNormalization InstanceNormalization
GroupNormalization MaxPool AveragePool GlobalAveragePool Resize Concat Split Slice Reshape Transpose Gather
ReduceMean ReduceSum ReduceMax Where Expand Squeeze Unsqueeze Flatten Pad Cast Shape SpaceToDepth
DepthToSpace Einsum
""".split())

# (case name pattern, runtime or None for both, reason) refusals allowed among MUST_PASS cases
MAY_REFUSE: tuple[tuple[str, str | None, str], ...] = (
    (r"^test_batchnorm_.*_training_mode$", None, "training-mode BatchNormalization (batch statistics): qir runs "
                                                 "inference models"),
)


@functools.lru_cache(maxsize=1)
def _cases() -> dict[str, object]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the generators overflow on purpose
        warnings.simplefilter("ignore")
        return {case.name: case for case in collect_testcases(None)}


def _op_types(case) -> set[str]:
    return {node.op_type for node in case.model.graph.node}


def family(case) -> str | None:
    """The excluded family a case belongs to (by any op type of its model), or None."""
    ops = _op_types(case)
    if any(node.domain == "ai.onnx.ml" for node in case.model.graph.node):
        return "classical ML (ai.onnx.ml)"
    if "Dropout" in ops and "training" in case.name:
        return "training-mode Dropout and MaxUnpool"
    return next((name for name, (_, members) in EXCLUDED.items() if ops & members), None)


def _as_array(value) -> np.ndarray:
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _may_refuse(name: str, runtime: str) -> str | None:
    return next((why for pattern, rt, why in MAY_REFUSE if re.match(pattern, name) and rt in (None, runtime)), None)


def _names_something(message: str, case) -> bool:
    """A clear refusal names an op type or a value (input, output, initializer) of the model,
    or, refusing the whole model, its opset."""
    if "opset" in message:
        return True
    graph = case.model.graph
    names = _op_types(case) | {v.name for v in (*graph.input, *graph.output, *graph.initializer)}
    names |= {o for node in graph.node for o in node.output}
    return any(n and n in message for n in names)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", sorted(_cases()))
def test_node_case(name, runtime, record_property):
    """One case: passes, or is refused clearly by qir before running (see the module docstring)."""
    from onnx.backend.test.runner import Runner

    case = _cases()[name]
    excluded = family(case)
    record_property("onnx_node_suite", (runtime, excluded))
    try:
        rep = backend_for(runtime).prepare(case.model)
    except QirError as exc:
        record_property("onnx_node_suite_refused", str(exc))
        if excluded is None:
            assert isinstance(exc, (UnsupportedOpError, ImportError_, ExecutionError)), exc
            assert _names_something(str(exc), case), f"the refusal names nothing in the model: {exc}"
        single = len(case.model.graph.node) == 1 and not name.endswith("_expanded")
        if single and _op_types(case) <= MUST_PASS:
            assert _may_refuse(name, runtime), f"{name} must pass on {runtime}; refused: {exc}"
        return
    assert not _lost_attributes(case, rep), "the IR's round trip lost or changed these attributes"
    for inputs, expected in case.data_sets:
        outputs = rep.run([_as_array(x) for x in inputs])
        Runner.assert_similar_outputs([_as_array(x) for x in expected], outputs, rtol=case.rtol, atol=case.atol)


def test_every_excluded_family_is_in_the_suite():
    """Each family of the exclude list matches cases (a stale entry is removed, not kept)."""
    seen = {family(case) for case in _cases().values()}
    assert set(EXCLUDED) <= seen, set(EXCLUDED) - seen


def test_every_must_pass_op_has_cases():
    ops = {op for case in _cases().values() for op in _op_types(case) if len(case.model.graph.node) == 1}
    assert MUST_PASS <= ops, MUST_PASS - ops



def _attribute_value(attr: onnx.AttributeProto):
    """An attribute's type and value; a tensor's by its contents (its name is not kept)."""
    if attr.type == onnx.AttributeProto.TENSOR:
        value = onnx.numpy_helper.to_array(attr.t)
        return attr.type, value.dtype.str, value.shape, value.tobytes()
    return attr.type, attr.SerializeToString(deterministic=True)


def _lost_attributes(case, rep) -> list[str]:
    """The attributes of the case's nodes that qir's export does not give back as they were
    (checked where the import folded nothing away, so the nodes pair up in order)."""
    from qir.io.onnx_export import export_onnx

    before = [n for n in case.model.graph.node if n.op_type != "Constant"]
    after = list(export_onnx(rep.ir).graph.node)
    if [n.op_type for n in before] != [n.op_type for n in after]:
        return []
    return [f"{old.op_type}.{a.name}" for old, new in zip(before, after) for a in old.attribute
            if _attribute_value(a) != next((_attribute_value(b) for b in new.attribute if b.name == a.name), None)]
