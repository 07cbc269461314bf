"""The bootstrap confidence of a ranking (qir.passes.lib.confidence)."""
from __future__ import annotations

import math

import numpy as np

from qir.passes.lib.confidence import rank_confidence


def _noisy(rng, means: dict[str, float], n: int, spread: float) -> dict[str, list[float]]:
    """Per row, n samples: a per-sample difficulty shared by every row plus the row's own noise."""
    hard = rng.normal(0.0, spread, n)
    return {k: list(m + hard + rng.normal(0.0, spread / 4, n)) for k, m in means.items()}


def test_planted_sensitive_quantizer_is_the_stable_top_1():
    rng = np.random.default_rng(1)
    means = {"planted": 0.2, **{f"q{i}": 0.01 * (1 + i % 3) for i in range(12)}}
    r = rank_confidence(_noisy(rng, means, 8, 0.01), descending=True)
    planted, others = r.rows[0], r.rows[1:]
    assert planted.name == "planted" and planted.rank == 1 and (planted.rank_low, planted.rank_high) == (1, 1)
    assert all(planted.low > o.high for o in others)  # its interval excludes every other row's
    assert r.settled(1) and r.stable_top_k >= 1 and r.named_alone("planted")
    assert planted.low <= planted.mean <= planted.high


def test_two_equal_quantizers_are_never_named_alone():
    rng = np.random.default_rng(2)
    values = _noisy(rng, {"a": 0.1, "b": 0.1}, 8, 0.02)
    means = {k: np.mean(v) for k, v in values.items()}
    order = sorted(values, key=lambda k: -means[k])
    r = rank_confidence({k: values[k] for k in order}, descending=True)
    assert not r.settled(1) and r.stable_top_k == 0
    assert not r.named_alone("a") and not r.named_alone("b")
    assert r.rows[0].rank_high == 2 and r.rows[1].rank_low == 1  # each may be either


def test_exact_ties_never_split_a_set():
    same = [0.5, 0.4, 0.3, 0.6]
    r = rank_confidence({"x": [0.9, 0.8, 0.95, 0.9], "a": same, "b": same, "c": [0.0, 0.01, 0.0, 0.02]}, descending=True)
    assert r.settled(1) and not r.settled(2) and r.settled(3) and r.stable_top_k == 3
    assert r.row("a").rank == r.row("b").rank == 2


def test_lower_first_and_nan_samples_and_one_sample():
    r = rank_confidence({"worst": [0.5, 0.6, math.nan, 0.55], "ok": [0.99, 0.98, 0.99, 0.97]}, descending=False)
    assert r.rows[0].name == "worst" and math.isclose(r.rows[0].mean, 0.55) and r.settled(1)
    one = rank_confidence({"a": [0.3], "b": [0.1]}, descending=True)
    assert one.stable_top_k is None and one.rows[0].low == one.rows[0].high == 0.3 and "one sample" in one.summary()


def test_seeded_and_json():
    v = {"a": [1.0, 2.0, 3.0], "b": [0.0, 2.5, 1.0]}
    assert rank_confidence(v, descending=True) == rank_confidence(v, descending=True)
    doc = rank_confidence(v, descending=True).to_json()
    assert doc["samples"] == 3 and [row["name"] for row in doc["rows"]] == ["a", "b"]


def test_rounds_double_and_two_equal_rows_use_every_sample():
    from qir.passes.lib.adaptive import rank_in_rounds, rounds
    from qir.runtimes.engine import EngineResult

    assert rounds(32) == [4, 8, 16, 32] and rounds(3) == [3] and rounds(4) == [4]
    rng = np.random.default_rng(3)
    values = {"a": rng.normal(0.5, 0.1, 20), "b": None}
    values["b"] = values["a"][::-1].copy()  # the same values, on other samples: equal means
    calls = []

    def evaluate(indices):
        calls.append(list(indices))
        rows = [{"variant": v, "sample": k, "values": {"out": {"mse": float(values[v][i])}}}
                for v in values for k, i in enumerate(indices)]
        return EngineResult(rows, ("mse",), ("out",))

    def confidence(result):
        per = result.per_sample("mse")
        return rank_confidence({v: per[v] for v, _ in result.ranked()}, descending=True)

    scores = list(np.linspace(0.9, 1.0, 20))
    result, sampling = rank_in_rounds(scores, evaluate, confidence, higher_is_better=True, need=1)
    assert not sampling.settled and sampling.used == 20 and "not settled" in sampling.reason
    assert calls[0] == [0, 1, 2, 3] and sum(len(c) for c in calls) == 20  # worst first, each sample once
    assert sorted({r["sample"] for r in result.rows}) == list(range(20))


def test_a_table_without_rows_ranks_nothing():
    # (tune's sensitivity stage with every unit cheap: nothing to rank)
    for descending in (True, False):
        ranking = rank_confidence({}, descending=descending)
        assert ranking.rows == () and not ranking.settled(1)
