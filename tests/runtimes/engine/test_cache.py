"""The engine's value cache keeps fake-quantized values as integer codes unless a fill fits the
budget as given, and reads back the same values either way."""
from __future__ import annotations

import numpy as np

from qir.runtimes.engine.cache import ValueCache, _Codes


def _fill(cache: ValueCache, values: dict[str, np.ndarray], scale: np.ndarray) -> list[bool]:
    """Put ``values`` (fake-quantized on ``scale``) after a clear(); which were kept as codes."""
    cache.clear()
    for name, value in values.items():
        cache.put(name, value, scale)
    return [isinstance(cache._mem.get(name), _Codes) for name in values]


def test_codes_only_while_a_fill_does_not_fit_as_given():
    rng = np.random.default_rng(0)
    scale = np.float32(0.05)
    values = {f"v{i}": (rng.integers(-128, 128, (64, 64)) * scale).astype(np.float32) for i in range(4)}
    roomy, tight = ValueCache(budget=1 << 20), ValueCache(budget=40_000)  # 4 x 16 KiB as floats, 4 KiB as codes
    assert _fill(roomy, values, scale) == [True] * 4  # (the first fill: nothing known yet)
    assert _fill(roomy, values, scale) == [False] * 4  # it fitted as given: floats, no encoding
    for _ in range(2):
        assert _fill(tight, values, scale) == [True] * 4 and tight.spilled == 0
    for cache in (roomy, tight):
        assert all(np.array_equal(cache.get(n), v) for n, v in values.items())
