"""PyTorch ``nn.Module`` → QIR (``qir.from_torch``), keeping module paths.

Steps:

1. The module runs once in eval mode under ``torch.no_grad`` with forward hooks that count how
   often every submodule is called (``ir.meta["torch_calls"]``; modules called 0 or more than
   once are listed in ``ir.meta["torch_call_warnings"]``) and that record the output structure.
2. It is exported in memory with torch's TorchScript ONNX exporter (opset 17 by default), or
   with torch's newer ``torch.export``-based one (``dynamo=True``; needs ``onnxscript``). Example
   inputs given positionally are first bound to ``forward()``'s parameter names
   (``inspect.signature``) and exported as keyword arguments, the way a dict of inputs is:
   Hugging Face models fill some of their keyword parameters themselves while being traced, and
   positional tensors then collide with them ("got multiple values for argument 'use_cache'").
   Only a ``forward(*args)`` (or positional-only parameters) keeps the positional call. Graph
   inputs are named after ``forward()``'s parameters; outputs after the returned structure
   (dict keys, ``output`` for one tensor, ``output_<i>`` for tuples and lists, nested ones
   joined with ``_``).
3. The ONNX importer lowers it. Every general node gets the module path that produced it, read
   from the TorchScript exporter's scope names (``/layer1/layer1.0/conv1/Conv`` → ``layer1.0.conv1``)
   or from the newer exporter's ``pkg.torch.onnx.name_scopes`` node metadata.
4. A model prepared with ``torch.ao.quantization`` (FakeQuantize, per tensor or per channel,
   qint8/quint8) exports its fake quantizers as QuantizeLinear/DequantizeLinear pairs, which the
   QDQ importer turns into calibration nodes holding the observers' scales and zero points as
   stored. Quantizers torch cannot export to ONNX (e.g. 16-bit ranges) raise a clear error.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import re
import sys
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import onnx

from qir.errors import ImportError_, InputError, QirError

if TYPE_CHECKING:
    import torch

__all__ = ["from_torch", "is_torch_module", "module_path", "torch_outputs", "load_factory", "split_inputs",
           "bind_to_parameters"]

logger = logging.getLogger(__name__)


def is_torch_module(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module``, without importing torch (a module exists only if
    torch was imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError_("from_torch needs PyTorch: pip install 'qir[torch]' (or pip install torch)") from None
    return torch


def module_path(node_name: str, root) -> str | None:
    """The dotted path of the submodule of ``root`` that an exported node came from.

    The exporter names nodes ``/<scope>/<scope>/.../<Op>``; a scope is a child's name, a
    qualified name ending with it (``layer1.0`` under ``layer1``) or a dotted path below the
    current module (``layer.0``: item 0 of a ModuleList ``layer``), with ``_<n>`` appended when a
    module is called again. Scopes are matched from the root down; the walk stops at the first
    scope that matches no submodule."""
    module, path = root, []
    for scope in (s for s in node_name.split("/")[1:-1] if s):
        found = None
        for candidate in (scope, re.sub(r"_\d+$", "", scope)):
            parts = candidate.split(".")
            found = next((sub for k in range(len(parts)) if (sub := _descend(module, parts[k:])) is not None), None)
            if found is not None:
                break
        if found is None:
            break
        path += found[0]
        module = found[1]
    return ".".join(path) or None


def _descend(module, names: list[str]):
    """``(names, submodule)`` when ``names`` lead from ``module`` down through its children, else None."""
    for name in names:
        module = dict(module.named_children()).get(name)
        if module is None:
            return None
    return names, module


def _flatten(value, prefix: str) -> list[tuple[str, Any]]:
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, Mapping):
        out = []
        for k, v in value.items():
            out += _flatten(v, f"{prefix}_{k}" if prefix != "output" else str(k))
        return out
    if isinstance(value, (tuple, list)):
        out = []
        for i, v in enumerate(value):
            out += _flatten(v, f"{prefix}_{i}")
        return out
    raise InputError(f"the module returns a {type(value).__name__}; from_torch handles tensors and "
                     "tuples/lists/dicts of tensors")


def torch_outputs(module, example_inputs) -> dict[str, np.ndarray]:
    """Run ``module`` on the example inputs; ``{output name: numpy array}`` named as the IR's."""
    torch = _torch()
    args, kwargs = split_inputs(example_inputs)
    with torch.no_grad():
        out = module(*args, **kwargs)
    return {n: v.detach().cpu().numpy() for n, v in _flatten(out, "output")}


def split_inputs(example_inputs) -> tuple[tuple, dict]:
    torch = _torch()
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise InputError("example_inputs must be a tensor, a tuple of tensors or a dict {parameter: tensor}")


def from_torch(module, example_inputs, *, opset: int = 17, input_names: Sequence[str] | None = None,
               dynamic_batch: bool = False, dynamo: bool = False):
    """``module`` (``torch.nn.Module``) as a QIR; see the module docstring.

    Args:
        example_inputs: a tensor, a tuple of tensors (positional ``forward`` arguments, bound to
            its parameter names) or a dict ``{parameter name: tensor}``.
        opset: the ONNX opset to export with.
        input_names: names for the graph inputs (default: ``forward()``'s parameter names).
        dynamic_batch: keep the first dimension of inputs and outputs dynamic.
        dynamo: export with torch's ``torch.export``-based exporter instead of TorchScript
            (needs ``pip install onnxscript``; an ImportError_ says so when it is missing), at
            opset ``max(opset, 18)``: it writes no older opset faithfully.
    """
    torch = _torch()

    from qir.io.onnx_import import import_onnx

    if not isinstance(module, torch.nn.Module):
        raise InputError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    if dynamo and importlib.util.find_spec("onnxscript") is None:
        raise ImportError_("from_torch(dynamo=True) uses torch's newer ONNX exporter, which needs onnxscript: "
                           "pip install onnxscript (or leave dynamo=False for the TorchScript exporter)")
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not 7 <= opset <= newest:
        raise InputError(f"opset {opset!r} is not an ONNX opset qir can export to; choose 7 to {newest} (default 17)")
    was_training = module.training
    module.eval()
    try:
        args, kwargs = bind_to_parameters(module, *split_inputs(example_inputs))
        names = list(input_names or _parameter_names(module, len(args), kwargs))
        try:
            calls = _count_calls(module, args, kwargs)
            with torch.no_grad():
                out = module(*args, **kwargs)
        except Exception as exc:  # the user's module rejects the example (a wrong shape, ...)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{type(module).__name__} failed on the example inputs ({_shapes(args, kwargs)}): "
                             f"{type(exc).__name__}: {first}; give inputs its forward() accepts") from exc
        output_names = [n for n, _ in _flatten(out, "output")]
        dynamic = ({n: {0: "batch"} for n in names + output_names} if dynamic_batch else None)
        try:
            with _static_fake_quant(module), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's deprecation and tracer notices are not the user's problem
                export = _export_dynamo if dynamo else _export_torchscript
                proto, scopes = export(module, args, kwargs, names=names, output_names=output_names, opset=opset,
                                       dynamic=dynamic)
        except QirError:
            raise
        except Exception as exc:  # torch's own message says which op or qconfig it could not export
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ImportError_(f"torch could not export {type(module).__name__} to ONNX: {first}") from exc
    finally:
        module.train(was_training)
    ir = import_onnx(proto)
    for op in ir.ops():
        if scopes.get(op.name):
            op.module = scopes[op.name]
    ir.meta["torch_calls"] = calls
    ir.meta["torch_call_warnings"] = {k: v for k, v in calls.items() if v != 1}
    if ir.meta["torch_call_warnings"]:
        logger.info("modules not called exactly once: %s", ir.meta["torch_call_warnings"])
    ir.touch()
    return ir


def _shapes(args: tuple, kwargs: dict) -> str:
    """The example inputs' shapes for a message: ``x 1x5, mask 1x5``."""
    items = [(f"input {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return ", ".join(f"{name} {'x'.join(map(str, getattr(a, 'shape', ()))) or type(a).__name__}" for name, a in items)


def bind_to_parameters(module, args: tuple, kwargs: dict[str, torch.Tensor]) -> tuple[tuple, dict[str, torch.Tensor]]:
    """Positional example tensors as keyword arguments named after ``module.forward``'s
    parameters (``(), {name: tensor}``, in the signature's order); ``(args, kwargs)`` unchanged
    when there are none, or when they fill ``*args`` or positional-only parameters."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # no signature to read (a builtin, a C extension)
        return args, kwargs
    if not args:
        return args, kwargs
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as exc:
        raise InputError(f"the example inputs do not fit {type(module).__name__}.forward{signature}: {exc}") from None
    params = signature.parameters
    if any(params[name].kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
           for name in bound.arguments):
        return args, kwargs
    return (), dict(bound.arguments)


def _export_torchscript(module, args, kwargs, *, names, output_names, opset, dynamic):
    """The ONNX model from torch's TorchScript exporter and ``{node name: module path}``. The
    exporter passes inputs positionally, so keyword inputs go in that way, in the order given,
    and :func:`_keyword_forward` hands them on to ``forward()`` by name."""
    torch = _torch()
    import onnx

    buffer = io.BytesIO()
    with _keyword_forward(module, list(kwargs)):
        torch.onnx.export(module, tuple(args) + tuple(kwargs.values()), buffer, input_names=names,
                          output_names=output_names, opset_version=opset, dynamo=False, dynamic_axes=dynamic,
                          do_constant_folding=True)
    proto = onnx.load_from_string(buffer.getvalue())
    return proto, {node.name: module_path(node.name, module) for node in proto.graph.node}


@contextlib.contextmanager
def _keyword_forward(module, keys: list[str]):
    """While active, ``module(*tensors)`` calls ``forward(**dict(zip(keys, tensors)))`` (nothing
    changes without ``keys``). It replaces ``forward`` on the instance, not a wrapper module
    around it, so scope, op and weight names stay the module's own (``conv.weight``, not
    ``module.conv.weight``)."""
    if not keys:
        yield
        return
    own = module.__dict__.get("forward")
    forward = module.forward

    def by_name(*tensors):
        return forward(**dict(zip(keys, tensors)))

    module.forward = by_name
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def _export_dynamo(module, args, kwargs, *, names, output_names, opset, dynamic):
    """The ONNX model from torch's ``torch.export``-based exporter and ``{node name: module path}``
    (from each node's ``pkg.torch.onnx.name_scopes``: the innermost scope that is a submodule)."""
    torch = _torch()
    import ast

    # at opset 18 or later: the exporter's (and onnx's) conversion to older opsets drops the scope
    # metadata and can leave attributes the older op does not have (ReduceMean's noop_with_empty_axes)
    program = torch.onnx.export(module, tuple(args), kwargs=kwargs or None, input_names=names,
                                output_names=output_names, opset_version=max(opset, 18), dynamo=True,
                                dynamic_axes=dynamic, verbose=False)
    proto = program.model_proto
    modules = {name for name, _ in module.named_modules() if name}
    scopes = {}
    for node in proto.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        found = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"]) if "pkg.torch.onnx.name_scopes" in meta else []
        paths = [re.sub(r"_\d+$", "", s) if s not in modules else s for s in found[1:-1]]
        scopes[node.name] = next((s for s in reversed(paths) if s in modules), None)
    return proto, scopes


_RANGES = {(-128, 127), (0, 255)}


@contextlib.contextmanager
def _static_fake_quant(module):
    """While exporting, every torch.ao fake quantizer applies its *stored* scale and zero point
    with ``fake_quantize_per_{tensor,channel}_affine`` (which the exporter writes as
    QuantizeLinear/DequantizeLinear); observers do not run. Fused observer+fake-quant modules,
    which torch cannot export, are covered too."""
    torch = _torch()
    from torch.ao.quantization import FakeQuantizeBase

    patched = []
    for name, sub in module.named_modules():
        if isinstance(sub, FakeQuantizeBase) and hasattr(sub, "scale"):
            qrange = (int(sub.quant_min), int(sub.quant_max))
            if qrange not in _RANGES:
                raise ImportError_(f"fake quantizer {name!r} uses the integer range {list(qrange)}; qir imports "
                                   "8-bit ranges [-128, 127] and [0, 255] (torch writes other ranges, e.g. "
                                   "reduce_range's [0, 127], with an integer Clip ONNX cannot pair); use a qconfig "
                                   "without reduce_range, e.g. get_default_qat_qconfig('qnnpack')")
            patched.append((sub, sub.forward))
            sub.forward = _static_forward(torch, sub)
    try:
        yield
    finally:
        for sub, forward in patched:
            sub.forward = forward


def _static_forward(torch, fq):
    enabled = bool(fq.fake_quant_enabled[0]) if hasattr(fq, "fake_quant_enabled") else True
    scale, zp = fq.scale.detach().clone(), fq.zero_point.detach().clone()
    qmin, qmax = int(fq.quant_min), int(fq.quant_max)
    per_channel = scale.numel() > 1 or getattr(fq, "is_per_channel", False)
    axis = int(getattr(fq, "ch_axis", 0))

    def forward(x):
        if not enabled:
            return x
        if per_channel:
            return torch.fake_quantize_per_channel_affine(x, scale.float(), zp.int(), axis, qmin, qmax)
        return torch.fake_quantize_per_tensor_affine(x, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                                                     qmin, qmax)

    return forward


def _parameter_names(module, n_args: int, kwargs: Mapping) -> list[str]:
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params[:n_args]]
    names += [f"input_{i}" for i in range(len(names), n_args)]
    return names + list(kwargs)


def _count_calls(module, args, kwargs) -> dict[str, int]:
    """``{module path: calls}`` for every submodule during one forward pass."""
    torch = _torch()
    counts = {name: 0 for name, _ in module.named_modules() if name}
    hooks = []
    for name, sub in module.named_modules():
        if name:
            hooks.append(sub.register_forward_hook(lambda *_, n=name: counts.__setitem__(n, counts[n] + 1)))
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return counts


def load_factory(spec: str):
    """``path/to/file.py:name`` → the ``nn.Module`` that ``name()`` returns (or ``name`` itself
    when it already is a module). The file is the user's code and runs as such; a file that is
    not ``.py``, or code that raises, is an InputError naming the file."""
    import importlib.util
    from pathlib import Path

    path, _, attr = spec.rpartition(":")
    if not path or not attr:
        raise InputError(f"write the model as FILE.py:FACTORY, got {spec!r}")
    file = Path(path)
    if not file.is_file():
        raise InputError(f"no such Python file: {file}")
    loader = importlib.util.spec_from_file_location(file.stem, file) if file.suffix == ".py" else None
    if loader is None or loader.loader is None:
        raise InputError(f"{file} is not a Python file (.py); write the model as FILE.py:FACTORY")
    code = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(code)
    except Exception as exc:  # the user's code: say where it failed (--debug shows its traceback)
        raise InputError(f"running {file} failed: {type(exc).__name__}: {exc}") from exc
    if not hasattr(code, attr):
        raise InputError(f"{file} defines no {attr!r}")
    obj = getattr(code, attr)
    torch = _torch()
    try:
        model = obj if isinstance(obj, torch.nn.Module) else obj()
    except Exception as exc:
        raise InputError(f"{spec}: calling {attr}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{spec} gave a {type(model).__name__}, not a torch.nn.Module")
    return model
