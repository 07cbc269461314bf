"""The pass contract: ``Pass``, ``AnalysisPass``, ``PassResult``, and the registry by name.

A pass is a class with a kebab-case ``name`` (its id in pipelines, dumps and the CLI) and a
``run(ir) -> PassResult``. Transform passes change the IR they are given, through the ``QIR``
mutators, and return it (``in_place``). Analysis passes never change their input: they return
``modified=False`` and a ``report``: a :class:`Report` dataclass (its fields typed, ``to_json()``
its JSON document, readable by key as the dicts it replaced were) or, for passes not yet
converted, JSON-able data; calling one checks that the input's ``version`` did not move.
Constructor keyword arguments are the pass's options, which is what ``name{key=value}`` in a
pipeline string sets.
"""
from __future__ import annotations

import abc
import inspect
import logging
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Iterator, Mapping, TypeVar

from qir.errors import NotFoundError, QirError, did_you_mean
from qir.graph import QIR
from qir.json_dump import JsonValue

__all__ = ["Pass", "AnalysisPass", "PassResult", "Report", "PassError", "PASSES", "register_pass", "get_pass",
           "pass_options"]

logger = logging.getLogger(__name__)


class PassError(QirError):
    """A pass failed or broke its contract; the message names the pass."""


_R = TypeVar("_R", bound="Report")


class Report:
    """Base of an analysis pass's typed report (a dataclass deriving from it): the fields say what
    the report holds; :meth:`to_json` is its JSON document, the report files' content (key for
    key what the report dict of earlier versions held, in field order). ``optional`` fields are
    left out while None (as the dict left out their keys). The report also reads by key
    (``report["nodes"]``, ``"left_out" in report``, ``report.get(...)``, ``dict(report)``), so code
    written against the dicts keeps working; new code reads the attributes."""

    optional: ClassVar[tuple[str, ...]] = ()

    def keys(self) -> list[str]:
        """The report's keys: its fields, less the ``optional`` ones that are None."""
        return [f.name for f in fields(self)  # type: ignore[arg-type]
                if not (f.name in self.optional and getattr(self, f.name) is None)]

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def to_json(self) -> dict[str, Any]:
        """The JSON document (without ``schema``/``version``, which the writer adds); reports
        nested in it (a node's entry) as their own documents."""
        return {k: _plain(v) for k, v in self.items()}

    @classmethod
    def from_json(cls: type[_R], doc: Mapping[str, JsonValue]) -> _R:
        """The report whose :meth:`to_json` is ``doc`` (a report read back from its JSON)."""
        return cls(**{f.name: doc[f.name] for f in fields(cls) if f.name in doc})  # type: ignore[arg-type]


def _plain(value: Any) -> Any:
    if isinstance(value, Report):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class PassResult:
    """What a pass returns: the (possibly same) IR, whether it changed, and its findings."""

    ir: QIR
    modified: bool
    report: dict[str, Any] | Report = field(default_factory=dict)


class Pass(abc.ABC):
    """Base of every pass. Subclasses set ``name`` and implement ``run``."""

    name: ClassVar[str]
    analysis: ClassVar[bool] = False

    @abc.abstractmethod
    def run(self, ir: QIR) -> PassResult:
        """Apply the pass to ``ir``."""

    def __call__(self, ir: QIR) -> PassResult:
        before = ir.version
        result = self.run(ir)
        if not isinstance(result, PassResult):
            raise PassError(f"pass {self.name!r}: run() returned {type(result).__name__}, not PassResult")
        if self.analysis and (result.modified or ir.version != before):
            raise PassError(f"analysis pass {self.name!r} changed the IR it analyses")
        if not self.analysis and result.ir is not ir:
            raise PassError(f"transform pass {self.name!r} must return the IR it was given")
        return result

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in getattr(self, "options", {}).items())
        return f"{self.name}{{{opts}}}" if opts else self.name


class AnalysisPass(Pass):
    """A pass that reads the IR and reports; it works on clones when it needs variants."""

    analysis: ClassVar[bool] = True


PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make ``cls`` available to pipelines and the CLI by ``cls.name``."""
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise ValueError(f"two passes named {cls.name!r}")
    PASSES[cls.name] = cls
    return cls


def pass_options(cls: type[Pass]) -> dict[str, inspect.Parameter]:
    """The keyword options a pass accepts (its constructor parameters)."""
    params = inspect.signature(cls.__init__).parameters
    return {n: p for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD}


def get_pass(name: str, **options: Any) -> Pass:
    """An instance of the pass ``name`` with ``options``; unknown names/options are explained."""
    from qir.passes import _load_passes

    _load_passes()
    if name not in PASSES:
        raise NotFoundError(did_you_mean(name, PASSES, "pass") + f"; passes: {', '.join(sorted(PASSES))}")
    cls = PASSES[name]
    accepted = pass_options(cls)
    for key in options:
        if key not in accepted:
            raise QirError(f"pass {name!r} has no option {key!r}; its options are "
                           f"{', '.join(accepted) or '(none)'}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise QirError(f"pass {name!r}: {exc}") from exc
