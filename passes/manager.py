"""Running passes in order: pipelines as strings, verification and IR dumps after each pass.

A pipeline string lists passes separated by commas, each optionally with options in braces::

    fold-bn,fuse{march=nash-e},insert-calibration,calibrate{method=percentile,percentile=99.9}

Option values are Python literals (numbers, booleans, quoted strings, lists) parsed with
``ast.literal_eval`` — never ``eval`` — and fall back to plain strings (``march=nash-e``).
Options the caller provides to every pass that accepts them (a :class:`PipelineContext`: the
calibration data, the march) fill in what the string leaves out.
"""
from __future__ import annotations

import ast
import logging
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable

from qir.errors import QirError
from qir.files import write_text
from qir.graph import QIR
from qir.passes.base import Pass, PassError, PassResult, get_pass, pass_options
from qir.verify import verify

__all__ = ["PassManager", "PipelineContext", "parse_pipeline", "build_pipeline"]

logger = logging.getLogger(__name__)


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets and quotes."""
    parts, depth, current, quote = [], 0, [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth < 0:
                raise QirError(f"unbalanced brackets in pipeline {text!r}")
        if ch == sep and depth == 0 and not quote:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth or quote:
        raise QirError(f"unbalanced {'quotes' if quote else 'brackets'} in pipeline {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_pipeline(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``"a,b{k=v}"`` → ``[("a", {}), ("b", {"k": v})]``."""
    steps = []
    for item in _split_top_level(text, ","):
        name, brace, rest = item.partition("{")
        options: dict[str, Any] = {}
        if brace:
            if not rest.endswith("}"):
                raise QirError(f"pipeline step {item!r}: options must end with '}}'")
            for pair in _split_top_level(rest[:-1], ","):
                key, eq, value = pair.partition("=")
                if not eq or not key.strip():
                    raise QirError(f"pipeline step {item!r}: write options as key=value")
                options[key.strip()] = _literal(value.strip())
        steps.append((name.strip(), options))
    if not steps:
        raise QirError("the pipeline is empty")
    return steps


@dataclass(frozen=True)
class PipelineContext:
    """What a caller gives every pass of a pipeline that takes that option, where the pipeline
    string leaves it out: ``data`` (calibration data: a folder, file or samples), ``march``, and
    ``measure`` (whether the repair passes measure their effect). None: not given."""

    data: Any = None
    march: str | None = None
    measure: bool | None = None


def build_pipeline(text: str, context: PipelineContext | None = None) -> list[Pass]:
    """Pass instances for a pipeline string; ``context`` options go to passes that take them."""
    from qir.passes import _load_passes
    from qir.passes.base import PASSES

    _load_passes()
    given = {f.name: getattr(context, f.name) for f in fields(PipelineContext)} if context is not None else {}
    given = {key: value for key, value in given.items() if value is not None}
    passes = []
    for name, options in parse_pipeline(text):
        if name in PASSES:
            accepted = pass_options(PASSES[name])
            for key, value in given.items():
                if key in accepted and key not in options:
                    options[key] = value
        passes.append(get_pass(name, **options))
    return passes


class PassManager:
    """Run passes in order; optionally verify the IR and dump it after each one.

    Dumps go to ``dump_dir`` as ``000_input.qir.txt``, ``001_<pass>.qir.txt``, ... (their names:
    :meth:`dump_files`) each starting with a ``# IR after <pass> (modified|unchanged)`` line,
    written by ``write(path, text)`` (default: :func:`qir.files.write_text`, atomic; a command
    passes its checked outputs' writer). A pass that fails is reported with
    the passes that ran before it; with ``verify_each`` an IR that breaks an invariant stops the
    pipeline at the pass that broke it.
    """

    def __init__(self, passes: Iterable[Pass] | str, *, verify_each: bool = True,
                 dump_dir: str | Path | None = None, context: PipelineContext | None = None,
                 write: Callable[[Path, str], Any] | None = None) -> None:
        self.passes = build_pipeline(passes, context) if isinstance(passes, str) else list(passes)
        self.verify_each = verify_each
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.write = write

    def dump_files(self) -> list[Path]:
        """The IR dumps :meth:`run` writes (none without ``dump_dir``), in order."""
        if self.dump_dir is None:
            return []
        labels = ["input"] + [p.name for p in self.passes]
        return [self.dump_dir / f"{i:03d}_{label}.qir.txt" for i, label in enumerate(labels)]

    def _dump(self, index: int, label: str, ir: QIR, modified: bool | None) -> None:
        if self.dump_dir is None:
            return
        state = "" if modified is None else (" (modified)" if modified else " (unchanged)")
        path = self.dump_dir / f"{index:03d}_{label}.qir.txt"
        text = f"# IR after {label}{state}\n{ir}"
        if self.write is not None:
            self.write(path, text)
        else:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            write_text(path, text)

    def run(self, ir: QIR) -> PassResult:
        """Apply every pass; the report holds each pass's report and time under its name."""
        self._dump(0, "input", ir, None)
        reports: dict[str, Any] = {}
        modified = False
        done: list[str] = []
        for i, p in enumerate(self.passes, start=1):
            start = time.perf_counter()
            try:
                result = p(ir)
            except QirError as exc:
                raise PassError(f"pass {p.name!r} failed{_after(done)}: {exc}") from exc
            except Exception as exc:
                raise PassError(f"pass {p.name!r} failed{_after(done)}: {type(exc).__name__}: {exc}") from exc
            elapsed = time.perf_counter() - start
            logger.info("%s: %s in %.2fs", p.name, "modified" if result.modified else "unchanged", elapsed)
            modified |= result.modified
            key = p.name if p.name not in reports else f"{p.name}#{i}"
            reports[key] = {"modified": result.modified, "seconds": round(elapsed, 4), **result.report}
            if not p.analysis:
                ir = result.ir
            if self.verify_each:
                problems = verify(ir)
                if problems:
                    raise PassError(f"the IR is invalid after pass {p.name!r}: " + "; ".join(problems[:5]))
            self._dump(i, p.name, ir, result.modified)
            done.append(p.name)
        return PassResult(ir, modified, {"passes": reports})


def _after(done: list[str]) -> str:
    return f" (after {', '.join(done)})" if done else ""
