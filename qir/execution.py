"""What a model runs on: one :class:`Execution` value (runtime, level, march), resolved once where a
request enters qir (the CLI, a pass's or facade's constructor, :func:`qir.run`) and passed down.

The rule, in one place (:meth:`Execution.resolve`):

- ``level`` is what the model computes: ``float`` (calibration nodes ignored), ``fakequant``
  (calibration nodes applied as quantize-dequantize; the default) or ``integer`` (integer codes,
  accumulators and requantization as an NPU computes them, per a march profile).
- the integer level runs on the ``numpy`` runtime only (onnxruntime computes float and fake
  quantization); there the runtime defaults to ``numpy`` and ``march`` to :data:`DEFAULT_MARCH`.
- at the other levels the runtime defaults to ``ort`` and a march is an error (it would be ignored),
  unless the caller uses the march otherwise (``march_alone``).

The runtime and level names are string enums: they compare, hash and format as their values, so
JSON reports and file names keep the strings they always had.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from qir.errors import InputError

__all__ = ["Runtime", "Level", "Execution", "DEFAULT_MARCH", "RUNTIME_NAMES", "LEVEL_NAMES"]

DEFAULT_MARCH = "nash-e"  # the profile the integer level emulates when none is named


class _Name(str, Enum):
    """A name that is its string value everywhere a string is expected (``==``, ``hash``, ``f""``)."""

    __str__ = str.__str__
    __format__ = str.__format__
    __repr__ = str.__repr__  # (messages quote a name as the user wrote it: 'integer')

    @classmethod
    def parse(cls, value: str | _Name, what: str, allowed: Iterable[_Name] | None = None) -> _Name:
        """``value`` as a member, or one clear error listing the choices."""
        choices = list(allowed) if allowed is not None else list(cls)
        for member in choices:
            if value == member.value:
                return member
        names = ", ".join(m.value for m in choices)
        raise InputError(f"unknown {what} {value!r}; choose one of {names}")


class Runtime(_Name):
    """Which executor runs the graph."""

    ORT = "ort"  # onnxruntime: float and fake quantization
    NUMPY = "numpy"  # qir's reference interpreter: every level, the integer one included


class Level(_Name):
    """What the model computes."""

    FLOAT = "float"
    FAKEQUANT = "fakequant"
    INTEGER = "integer"


RUNTIME_NAMES = tuple(r.value for r in Runtime)
LEVEL_NAMES = tuple(lv.value for lv in Level)


@dataclass(frozen=True)
class Execution:
    """A resolved (runtime, level, march): build it with :meth:`resolve`, never by hand."""

    runtime: Runtime
    level: Level
    march: str | None = None

    @classmethod
    def resolve(cls, runtime: str | None = None, level: str | None = None, march: str | None = None, *,
                levels: Iterable[Level] = tuple(Level), march_alone: bool = False) -> Execution:
        """The execution a request asks for, its defaults filled in (module docstring), or one
        clear error: an unknown name, a level the caller does not take (``levels``), the integer
        level asked of onnxruntime, a march without the integer level (unless ``march_alone``:
        then it is kept as given for the caller's own use)."""
        lv = Level.parse(Level.FAKEQUANT if level is None else level, "level", levels)
        rt = None if runtime is None else Runtime.parse(runtime, "runtime")
        if lv is Level.INTEGER:
            if rt not in (None, Runtime.NUMPY):
                raise InputError(f"the integer level runs on the numpy runtime only (onnxruntime computes float and "
                                 f"fake quantization), not {rt.value!r}; leave the runtime out or choose numpy")
            return cls(Runtime.NUMPY, lv, march or DEFAULT_MARCH)
        if march is not None and not march_alone:
            raise InputError(f"a march ({march}) applies to the integer level only, not level {lv.value!r}; "
                             "ask for level integer, or leave the march out")
        return cls(rt or Runtime.ORT, lv, march)

    @property
    def integer(self) -> bool:
        """Whether this runs at the integer level (the march then names the profile)."""
        return self.level is Level.INTEGER

    def describe(self) -> str:
        """How a summary names the level: ``""`` for fake quantization (the default),
        ``" at the float level"``, ``" at the integer level of nash-e"``."""
        if self.integer:
            return f" at the integer level of {self.march}"
        return "" if self.level is Level.FAKEQUANT else f" at the {self.level} level"
