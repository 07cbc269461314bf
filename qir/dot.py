"""The IR as a picture: Graphviz DOT text, rendered to SVG/PNG when Graphviz is installed.

Running nodes are drawn (ops as boxes, calibration nodes as diamonds coloured by mode);
activations are the edges between them, labelled with their type; graph inputs and outputs are
ellipses. Weights are listed inside their op's box (name and type), not drawn as nodes, so a
large model stays readable.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from qir.errors import QirError
from qir.printer import format_type
from qir.records import CalibRecord

__all__ = ["to_dot", "render"]

_MODE_COLOURS = {"int8": "#9ecae1", "int16": "#a1d99b", "fp16": "#fdd0a2", "float": "#e0e0e0"}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(ir: Any, *, show_weights: bool = True) -> str:
    """DOT text for ``ir``; node ids are the IR's names, so the picture is deterministic."""
    lines = [f"digraph {_q(ir.name)} {{", "  rankdir=TB;",
             '  node [fontname="Helvetica", fontsize=10];', '  edge [fontname="Helvetica", fontsize=8];']
    for name in ir.inputs:
        rec = ir.value(name)
        lines.append(f"  {_q('in:' + name)} [shape=ellipse, style=filled, fillcolor=\"#ffffcc\", "
                     f"label={_q(name + chr(10) + format_type(rec.dtype, rec.shape))}];")
    for rec in ir.runnables():
        if isinstance(rec, CalibRecord):
            label = f"{rec.name}\\n{rec.mode.value} {rec.role.value}"
            colour = _MODE_COLOURS[rec.mode.value]
            lines.append(f"  {_q(rec.name)} [shape=diamond, style=filled, fillcolor=\"{colour}\", "
                         f"label=\"{label}\"];")
            continue
        label = [rec.name, rec.op_type]
        if show_weights:
            for v in rec.inputs:
                if v and ir.value(v).kind.value == "weight":
                    w = ir.value(v)
                    label.append(f"@{v} {format_type(w.dtype, w.shape)}")
        text = "\\n".join(s.replace("\\", "\\\\").replace('"', '\\"') for s in label)
        lines.append(f"  {_q(rec.name)} [shape=box, style=rounded, label=\"{text}\"];")
    for rec in ir.runnables():
        for v in rec.inputs:
            if not v:
                continue
            val = ir.value(v)
            if val.kind.value == "weight":
                continue
            src = ir.producer(v)
            tail = src.name if src is not None else "in:" + v
            lines.append(f"  {_q(tail)} -> {_q(rec.name)} [label={_q(format_type(val.dtype, val.shape))}];")
    for name in ir.outputs:
        src = ir.producer(name)
        lines.append(f"  {_q('out:' + name)} [shape=ellipse, style=filled, fillcolor=\"#ccebc5\", "
                     f"label={_q(name)}];")
        tail = src.name if src is not None else "in:" + name
        lines.append(f"  {_q(tail)} -> {_q('out:' + name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(dot_text: str, path: str | Path, fmt: str) -> Path:
    """Render DOT text to ``path`` as ``svg`` or ``png`` with Graphviz's ``dot``.

    Raises:
        QirError: Graphviz is not installed or failed.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise QirError("Graphviz 'dot' is not installed, so the picture cannot be rendered; "
                       "install it (apt-get install graphviz) or use --format dot")
    path = Path(path)
    proc = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=dot_text.encode(),
                          capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise QirError(f"Graphviz failed: {proc.stderr.decode(errors='replace').strip()}")
    return path
