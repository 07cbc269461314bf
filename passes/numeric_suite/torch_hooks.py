"""PyTorch Numeric Suite jobs for eager-mode quantized models, done with qir's own forward hooks.

These are the three comparisons of ``torch.ao.ns._numeric_suite`` (weights, per-module outputs,
float shadows of quantized modules), rewritten without ``torch.ao.ns``: the user's models are
deep-copied, hooks are put on the copies, and every result is returned as numpy arrays together
with its SQNR in dB. The user's models are never changed (no hooks, loggers or shadows are left
on them and their state is untouched).

``sqnr_db(x, y)``
    ``20 * log10(||x|| / ||x - y||)`` in float64, the formula of
    ``torch.ao.ns.fx.utils.compute_sqnr``: +inf when ``x == y`` (and ``x`` is not all zeros),
    nan when both norms are 0. ``x`` is the reference (float), ``y`` the approximation.

``compare_weights(float_state_dict, quantized_state_dict)``
    For every key of the quantized state dict that torch's ``compare_weights`` would report,
    ``{"float", "quantized", "sqnr_db"}`` with the float weight and the dequantized quantized
    weight as float32 arrays. Keys and matching follow torch:

    * a quantized key ending in ``weight`` (quantized conv modules save their weight as
      ``<name>.weight``) is paired with the same key of the float dict, else with the first float
      key whose name without its last part, or without its last two parts, equals the quantized
      key without its last part, all compared with the dots removed (torch's rule);
    * ``<name>._packed_params._packed_params`` (quantized and dynamic Linear) is paired with
      ``<name>.weight``, else by the same rule applied to ``<name>``; its quantized weight is the
      first item of the packed tuple;
    * ``<lstm>._all_weight_values.<i>.param`` (dynamic LSTM) is paired, like torch, with the
      hidden-hidden weight ``<lstm>.weight_hh_l<i>`` (only reported if ``weight_ih_l<i>`` exists
      too). For a bidirectional LSTM entry ``i`` is layer ``i // 2``, direction ``i % 2``
      (``_reverse``); torch pairs it with layer ``i`` instead, which is wrong there.

``compare_model_outputs(float_model, quantized_model, *inputs, allow_list=None)``
    Forward hooks on both models record the output of the modules torch's
    ``compare_model_outputs`` would log; both models run on every input. The result is
    ``{module_name: {"float": [arrays], "quantized": [dequantized arrays], "sqnr_db": [floats]}}``,
    one list entry per call of the module (several inputs, or a module called several times,
    accumulate). Which modules are logged follows ``torch.ao.quantization.prepare`` with a logger
    qconfig: leaf modules (parametrizations ignored) whose type is in ``allow_list`` (default:
    ``torch.ao.quantization.quantization_mappings.get_default_compare_output_module_list()``,
    i.e. float, QAT, quantized and dynamic modules of the default mappings, QuantStub/DeQuantStub,
    Quantize/DeQuantize), except ``nn.Sequential`` and ``DeQuantStub`` and never inside an
    ``nn.Dropout``; fused modules (``torch.ao.nn.intrinsic._FusedModule``) as a whole; the results
    of ``FloatFunctional``/``QFunctional`` ops (through their ``activation_post_process``) whatever
    ``allow_list`` says; in the quantized model also the non-leaf quantized/dynamic ``Linear`` and
    ``LSTM``. Names are module paths (``named_children`` from the root; the root is ``""``). A
    quantized module that ran is reported if the float model logs the same name, else (torch's
    rule) the first float name, in descending order of ``<name>.stats``, whose path or parent path
    equals its path with the dots removed. Differences from torch: each positional input is one
    forward call (a tuple is unpacked into the positional arguments of one call, so pass ``(a,
    b)`` for a two-argument model; torch calls ``model(*data)`` once); torch also skips modules
    whose own ``qconfig`` attribute is ``None`` or a real qconfig, which is ignored here; for a
    module returning a tuple/list the first tensor in it is recorded.

``compare_model_stub(float_model, quantized_model, module_swap_list, *inputs)``
    Like torch's ``Shadow``: walking both models' children by name from the root (recursing
    into a float child only while its type is not in ``module_swap_list``), every quantized child
    whose float counterpart's type is in ``module_swap_list`` and whose module types differ from it
    runs as usual, and the float counterpart additionally runs on the same, dequantized,
    arguments (hooks on the copies; ``add``/``add_scalar``/``mul``/``mul_scalar``/``cat``/
    ``add_relu`` of ``QFunctional``/``FloatFunctional`` are wrapped the same way). The quantized
    model's own outputs flow on unchanged. Result:
    ``{name: {"float": [...], "quantized": [...], "sqnr_db": [...]}}``. Difference from torch:
    torch's ``ShadowLogger`` records ``x[0]`` whenever ``len(x) > 1``, which for a tensor with a
    batch larger than 1 keeps only the first sample; here the whole output is recorded (for a
    tuple/list output, its first tensor, as torch).

Bad arguments raise ``qir.errors.InputError``; a model that fails on an input raises
``qir.errors.ExecutionError``. Without PyTorch, the torch functions raise ``qir.errors.ImportError_``.
"""
from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from qir.errors import ExecutionError, ImportError_, InputError

if TYPE_CHECKING:
    import torch

__all__ = ["compare_weights", "compare_model_outputs", "compare_model_stub", "sqnr_db"]

logger = logging.getLogger(__name__)

# Ops of FloatFunctional/QFunctional that torch's Shadow forwards to the float module too.
_FUNCTIONAL_METHODS = ("add", "add_scalar", "mul", "mul_scalar", "cat", "add_relu")


def _torch(what: str):
    try:
        import torch
    except ImportError:
        raise ImportError_(f"{what} needs PyTorch: pip install 'qir[torch]' (or pip install torch)") from None
    return torch


def _is_torch_tensor(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "is_quantized") \
        and hasattr(value, "detach")


def _tensor_to_numpy(t) -> np.ndarray:
    """A torch tensor (quantized ones dequantized) as a numpy array; half types become float32."""
    torch = _torch("qir.passes.numeric_suite.torch_hooks")
    t = t.detach()
    if t.is_quantized:
        t = t.dequantize()
    t = t.cpu()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.numpy()


def _as_float64(value, what: str) -> np.ndarray:
    if _is_torch_tensor(value):
        return _tensor_to_numpy(value).astype(np.float64)
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"sqnr_db: {what} is a {type(value).__name__}, which is not numeric ({exc}); "
                         "pass a numpy array or a torch tensor") from None


def sqnr_db(x, y) -> float:
    """SQNR of ``y`` against the reference ``x`` in dB: ``20 * log10(||x|| / ||x - y||)``.

    Computed in float64 from numpy arrays (torch tensors are dequantized and converted). Same
    formula as ``torch.ao.ns.fx.utils.compute_sqnr``: +inf if ``x == y``, nan if both are zero."""
    a = _as_float64(x, "x")
    b = _as_float64(y, "y")
    if a.shape != b.shape:
        raise InputError(f"sqnr_db: x has shape {a.shape} but y has shape {b.shape}; "
                         "pass two arrays of the same shape (reference first)")
    signal = np.linalg.norm(a.ravel())
    noise = np.linalg.norm((a - b).ravel())
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(20.0 * np.log10(np.float64(signal) / np.float64(noise)))


def _pair_sqnr(name: str, reference: np.ndarray, approx: np.ndarray) -> float:
    try:
        return sqnr_db(reference, approx)
    except InputError as exc:
        logger.warning("%s: no SQNR (%s)", name, exc)
        return float("nan")


# ---------------------------------------------------------------------------------------------
# compare_weights


def _dotless(parts: list[str]) -> str:
    return "".join(parts)


def _torch_find_match(candidates: Iterable[str], key: str, postfix: str) -> str | None:
    """torch's ``_find_match``: paths compared with the dots removed, first candidate wins."""
    candidates = list(candidates)
    parts = key.split(".")
    if parts[-1] != postfix:
        return None
    targets = [_dotless(parts[:-1])]
    if postfix == "_packed_params":
        # "fc._packed_params._packed_params" also matches "fc.weight"
        targets.append(_dotless(parts[:-2]) or None)
    for target in targets:
        if target is None:
            continue
        for cand in candidates:
            cparts = cand.split(".")
            if target == _dotless(cparts[:-1]) or target == _dotless(cparts[:-2]):
                return cand
    return None


def _lstm_hh_weight(packed) -> Any:
    """The quantized hidden-hidden weight of one dynamic-LSTM cell's packed parameters (the state
    layout torch's compare_weights reads)."""
    return packed.__getstate__()[0][4][1].__getstate__()[0][0]


def compare_weights(float_state_dict: Mapping[str, torch.Tensor],
                    quantized_state_dict: Mapping[str, torch.Tensor]) -> dict[str, dict[str, np.ndarray | float]]:
    """``{quantized_key: {"float", "quantized", "sqnr_db"}}`` for the weights torch's
    ``torch.ao.ns._numeric_suite.compare_weights`` pairs (see the module docstring); arrays are
    float32 numpy arrays, the quantized one dequantized."""
    torch = _torch("compare_weights")
    for what, sd in (("float_state_dict", float_state_dict), ("quantized_state_dict", quantized_state_dict)):
        if isinstance(sd, torch.nn.Module):
            raise InputError(f"compare_weights: {what} is a model ({type(sd).__name__}); "
                             "pass its state dict: model.state_dict()")
        if not isinstance(sd, Mapping):
            raise InputError(f"compare_weights: {what} is a {type(sd).__name__}, not a mapping; "
                             "pass model.state_dict()")
    float_keys = list(float_state_dict)
    pairs: list[tuple[str, str, Any]] = []  # (quantized key, float key, quantized tensor)
    for key, value in quantized_state_dict.items():
        parts = key.split(".")
        if parts[-1] == "weight":
            fkey = key if key in float_state_dict else _torch_find_match(float_keys, key, "weight")
            if fkey is not None:
                pairs.append((key, fkey, value))
                continue
        if parts[-1] == "_packed_params":
            natural = ".".join(parts[:-2] + ["weight"]) if len(parts) > 2 else None
            fkey = natural if natural in float_state_dict else \
                _torch_find_match(float_keys, key, "_packed_params")
            if fkey is not None:
                try:
                    qweight = value[0]
                except (TypeError, IndexError, KeyError):
                    logger.debug("compare_weights: %s is not a packed (weight, bias) pair; skipped", key)
                else:
                    pairs.append((key, fkey, qweight))
        if parts[-1] == "param" and len(parts) >= 3 and parts[-3] == "_all_weight_values":
            prefix = ".".join(parts[:-3])
            prefix = prefix + "." if prefix else ""
            try:
                index = int(parts[-2])
            except ValueError:
                continue
            if f"{prefix}weight_hh_l0_reverse" in float_state_dict:
                layer, suffix = index // 2, ("_reverse" if index % 2 else "")
            else:
                layer, suffix = index, ""
            ih, hh = f"{prefix}weight_ih_l{layer}{suffix}", f"{prefix}weight_hh_l{layer}{suffix}"
            if ih in float_state_dict and hh in float_state_dict:
                try:
                    qweight = _lstm_hh_weight(value)
                except Exception as exc:  # the packed layout is torch-internal
                    logger.warning("compare_weights: cannot unpack the LSTM weights of %s (%s: %s); skipped",
                                   key, type(exc).__name__, exc)
                else:
                    pairs.append((key, hh, qweight))

    result: dict[str, dict] = {}
    for key, fkey, qweight in pairs:
        fweight = float_state_dict[fkey]
        if not (_is_torch_tensor(fweight) and _is_torch_tensor(qweight)):
            logger.debug("compare_weights: %s or %s is not a tensor; skipped", key, fkey)
            continue
        f = _tensor_to_numpy(fweight).astype(np.float32, copy=False)
        q = _tensor_to_numpy(qweight).astype(np.float32, copy=False)
        result[key] = {"float": f, "quantized": q, "sqnr_db": _pair_sqnr(key, f, q)}
        logger.debug("compare_weights: %s <-> %s: %.2f dB", key, fkey, result[key]["sqnr_db"])
    if not result:
        raise InputError("compare_weights: no weight of quantized_state_dict matches a key of "
                         f"float_state_dict (float keys: {float_keys[:8]}{'...' if len(float_keys) > 8 else ''}; "
                         f"quantized keys: {list(quantized_state_dict)[:8]}...); pass "
                         "float_model.state_dict() and the state dict of the model quantized from it")
    return result


# ---------------------------------------------------------------------------------------------
# models: shared helpers


def check_models(torch, what: str, float_model, quantized_model, inputs) -> None:
    for name, model in (("float_model", float_model), ("quantized_model", quantized_model)):
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"{what}: {name} is a {type(model).__name__}, not a torch.nn.Module; "
                             "pass the float model and the model quantized from it")
        if model.training:
            logger.warning("%s: %s is in training mode, so dropout and batch norm make its outputs "
                           "vary; call .eval() first", what, name)
    if not inputs:
        raise InputError(f"{what}: no inputs; pass at least one input tensor (a tuple for a model "
                         "with several positional arguments)")


def _first_tensor(value):
    """The value itself if it is a tensor, else the first tensor in a nested tuple/list/dict."""
    if _is_torch_tensor(value):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _record(store: list, name: str, value) -> None:
    tensor = _first_tensor(value)
    if tensor is None:
        logger.debug("%s returned %s, which holds no tensor; not recorded", name, type(value).__name__)
        return
    store.append(_tensor_to_numpy(tensor))


def _run(torch, what: str, model, label: str, inputs) -> None:
    with torch.no_grad():
        for i, inp in enumerate(inputs):
            args = inp if isinstance(inp, tuple) else (inp,)
            try:
                model(*args)
            except Exception as exc:
                raise ExecutionError(f"{what}: {label} failed on input #{i} ({type(exc).__name__}: {exc}); "
                                     "check that each input fits the model's forward() (a tuple is "
                                     "unpacked into positional arguments)") from exc


def _entry(name: str, floats: list, quants: list) -> dict:
    if len(floats) != len(quants):
        logger.warning("%s ran %d time(s) in the float model but %d time(s) in the quantized model; "
                       "SQNR pairs the first %d", name, len(floats), len(quants), min(len(floats), len(quants)))
    return {"float": floats, "quantized": quants,
            "sqnr_db": [_pair_sqnr(name, f, q) for f, q in zip(floats, quants)]}


# ---------------------------------------------------------------------------------------------
# compare_model_outputs


def _type_before_parametrizations(torch, module) -> type:
    return torch.nn.utils.parametrize.type_before_parametrizations(module)


def _is_leaf(torch, module) -> bool:
    """No children, ignoring a parametrization container (torch's
    ``has_no_children_ignoring_parametrizations``)."""
    if len(module._modules) == 0:
        return True
    if torch.nn.utils.parametrize.is_parametrized(module):
        return len(module._modules) == 1 and "parametrizations" in module._modules
    return False


def _logged_modules(torch, root, allow: set, non_leaf: set) -> list[tuple[str, Any]]:
    """(name, module to hook) for the modules ``torch.ao.quantization.prepare`` would give a logger."""
    from torch.ao.nn.intrinsic import _FusedModule
    from torch.ao.nn.quantized import FloatFunctional, QFunctional
    from torch.ao.quantization import DeQuantStub
    try:
        from torch.ao.quantization.quantization_mappings import DEFAULT_MODULE_TO_ACT_POST_PROCESS as special
    except ImportError:  # pragma: no cover - older/newer torch
        special = {}
    nn = torch.nn
    found: list[tuple[str, Any]] = []

    def visit(module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            ctype = _type_before_parametrizations(torch, child)
            if ctype is nn.Dropout:
                continue
            if issubclass(ctype, (FloatFunctional, QFunctional)):
                # their ops call self.activation_post_process(result); torch logs there
                target = getattr(child, "activation_post_process", None)
                if isinstance(target, nn.Module):
                    found.append((path, target))
                continue
            if isinstance(child, _FusedModule) or ctype in non_leaf:
                found.append((path, child))
                continue
            if child.training and type(child) in special:
                continue  # torch attaches a fixed-qparams fake quantizer there, no logger
            visit(child, path)
        if isinstance(module, (nn.Sequential, DeQuantStub)):
            return
        mtype = _type_before_parametrizations(torch, module)
        if mtype in allow and (_is_leaf(torch, module) or hasattr(module, "weight_fake_quant")):
            found.append((prefix, module))

    visit(root, "")
    return found


def _stats_key(name: str) -> str:
    return f"{name}.stats" if name else "stats"


def _match_output_name(q_name: str, float_names: list[str]) -> str | None:
    """The float name paired with a quantized one: the same name, else torch's dotless rule over
    the float names in descending order of their ``<name>.stats`` keys."""
    if q_name in float_names:
        return q_name
    ordered = sorted((_stats_key(n) for n in float_names), reverse=True)
    match = _torch_find_match(ordered, _stats_key(q_name), "stats")
    if match is None:
        return None
    return match[: -len(".stats")] if match != "stats" else ""


def _class_set(what: str, arg: str, value, example: str) -> set:
    """``value`` (one class or an iterable of classes, not empty) as a set, else an InputError."""
    if isinstance(value, type):
        value = [value]
    try:
        classes = set(value)
    except TypeError:
        raise InputError(f"{what}: {arg} is a {type(value).__name__}; pass a list of module classes, "
                         f"e.g. {example}") from None
    if not classes or any(not isinstance(c, type) for c in classes):
        raise InputError(f"{what}: {arg} must hold module classes, got {list(classes)!r}; pass e.g. {example}")
    return classes


def compare_model_outputs(float_model, quantized_model, *inputs, allow_list=None) -> dict[str, dict]:
    """Outputs of the modules of ``float_model`` and ``quantized_model`` that torch's
    ``compare_model_outputs`` logs, paired by module name, for each input (see the module
    docstring): ``{name: {"float": [...], "quantized": [...], "sqnr_db": [...]}}``."""
    torch = _torch("compare_model_outputs")
    what = "compare_model_outputs"
    check_models(torch, what, float_model, quantized_model, inputs)
    if allow_list is None:
        from torch.ao.quantization.quantization_mappings import get_default_compare_output_module_list
        allow = set(get_default_compare_output_module_list())
    else:
        allow = _class_set(what, "allow_list", allow_list, "[torch.nn.Conv2d, torch.ao.nn.quantized.Conv2d]")
    nnq, nnqd = torch.ao.nn.quantized, torch.ao.nn.quantized.dynamic
    non_leaf = {nnqd.Linear, nnq.Linear, nnqd.LSTM, torch.nn.LSTM}

    fm, qm = copy.deepcopy(float_model), copy.deepcopy(quantized_model)
    records: dict[str, dict[str, list]] = {"float": {}, "quantized": {}}
    names: dict[str, list[str]] = {}
    for side, model, leafs in (("float", fm, set()), ("quantized", qm, non_leaf)):
        store = records[side]
        names[side] = []
        for name, module in _logged_modules(torch, model, allow, leafs):
            if name in store:
                continue
            store[name] = []
            names[side].append(name)

            def hook(mod, args, output, _store=store[name], _name=name):
                _record(_store, _name, output)

            module.register_forward_hook(hook, prepend=True)
    logger.debug("%s: logging %d float and %d quantized modules", what, len(names["float"]), len(names["quantized"]))

    _run(torch, what, fm, "float_model", inputs)
    _run(torch, what, qm, "quantized_model", inputs)

    result: dict[str, dict] = {}
    for q_name in names["quantized"]:
        quants = records["quantized"][q_name]
        if not quants:
            continue
        f_name = _match_output_name(q_name, names["float"])
        if f_name is None:
            logger.debug("%s: quantized module %r has no logged float counterpart", what, q_name)
            continue
        result[q_name] = _entry(q_name, records["float"][f_name], quants)
    if not result:
        raise InputError(
            f"{what}: no module name is logged in both models (float: {names['float'][:8]}, quantized "
            f"modules that ran: {[n for n in names['quantized'] if records['quantized'][n]][:8]}); "
            "pass the float model and the model quantized from it (same submodule names), or an "
            "allow_list with the module classes of both")
    return result


# ---------------------------------------------------------------------------------------------
# compare_model_stub


def _dequantize_args(value):
    if _is_torch_tensor(value):
        return value.dequantize() if value.is_quantized else value
    if isinstance(value, (list, tuple)):
        return type(value)(_dequantize_args(v) for v in value)
    if isinstance(value, dict):
        return {k: _dequantize_args(v) for k, v in value.items()}
    return value


def _same_module_types(a, b) -> bool:
    return [type(m) for m in a.modules()] == [type(m) for m in b.modules()]


def compare_model_stub(float_model, quantized_model, module_swap_list, *inputs) -> dict[str, dict]:
    """Quantized modules next to their float counterparts run on the same, dequantized, input
    (torch's ``Shadow``; see the module docstring):
    ``{name: {"float": [...], "quantized": [...], "sqnr_db": [...]}}``."""
    torch = _torch("compare_model_stub")
    what = "compare_model_stub"
    check_models(torch, what, float_model, quantized_model, inputs)
    swap = _class_set(what, "module_swap_list", module_swap_list, "[torch.nn.Conv2d, torch.nn.Linear]")
    from torch.ao.nn.quantized import FloatFunctional, QFunctional

    fm, qm = copy.deepcopy(float_model), copy.deepcopy(quantized_model)
    pairs: list[tuple[str, Any, Any]] = []

    def visit(fmod, qmod, prefix: str) -> None:
        fchildren = dict(fmod.named_children())
        for name, qchild in qmod.named_children():
            if name not in fchildren:
                continue
            fchild = fchildren[name]
            path = f"{prefix}.{name}" if prefix else name
            if type(fchild) not in swap:
                visit(fchild, qchild, path)
            elif not _same_module_types(qchild, fchild):
                pairs.append((path, qchild, fchild))

    visit(fm, qm, "")
    if not pairs:
        raise InputError(f"{what}: no child of quantized_model has a float counterpart (same name) "
                         f"whose type is in module_swap_list {sorted(t.__name__ for t in swap)} and "
                         "differs from it; pass the float model and the model quantized from it, and "
                         "the float classes of the layers to shadow")

    records: dict[str, dict[str, list]] = {}
    for path, qchild, fchild in pairs:
        rec = records[path] = {"float": [], "quantized": []}

        def shadow(q_out, f_call, args, kwargs, _rec=rec, _path=path):
            f_out = f_call(*_dequantize_args(args), **_dequantize_args(kwargs))
            _record(_rec["quantized"], _path, q_out)
            _record(_rec["float"], _path, f_out)

        def hook(mod, args, kwargs, output, _fchild=fchild, _shadow=shadow):
            _shadow(output, _fchild, args, kwargs)

        qchild.register_forward_hook(hook, with_kwargs=True)
        if isinstance(qchild, (QFunctional, FloatFunctional)):
            for method in _FUNCTIONAL_METHODS:
                q_op, f_op = getattr(qchild, method, None), getattr(fchild, method, None)
                if q_op is None or f_op is None:
                    continue

                def wrapped(*args, _q_op=q_op, _f_op=f_op, _shadow=shadow, **kwargs):
                    out = _q_op(*args, **kwargs)
                    _shadow(out, _f_op, args, kwargs)
                    return out

                setattr(qchild, method, wrapped)  # on the copy only
    logger.debug("%s: shadowing %s", what, [p for p, _, _ in pairs])

    _run(torch, what, qm, "quantized_model", inputs)

    result: dict[str, dict] = {}
    for path, rec in records.items():
        if not rec["quantized"]:
            logger.warning("%s: %s did not run on the inputs", what, path)
        result[path] = _entry(path, rec["float"], rec["quantized"])
    return result
