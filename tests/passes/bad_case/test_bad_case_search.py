"""Rank shares of the bad-case search (:func:`qir.passes.bad_case.search.search_on_cluster`)
when one rank fails: every rank hears of it instead of waiting, whatever the error was."""
from __future__ import annotations

import pytest

from qir.errors import QirError
from qir.passes.bad_case import search as bad_case_search


class TwoRanks:
    """This process as rank 0 of two whose rank 1 holds other samples and sends ``theirs`` when
    values are gathered; records what this rank sent."""

    def __init__(self, theirs) -> None:
        self.theirs, self.sent, self.rank = theirs, [], 0

    def open(self) -> None:
        pass

    def gather(self, value):
        self.sent.append(value)
        if len(self.sent) == 1:  # the digests: rank 1's samples are others
            return [value, ["another sample"]]
        return [value, self.theirs]

    def where(self, k: int) -> str:
        return f"rank {k}"


class Failing:
    def score(self, sample):
        raise RuntimeError("out of memory in a kernel")


@pytest.fixture
def ranks(monkeypatch):
    def install(theirs):
        executor = TwoRanks(theirs)
        monkeypatch.setattr(bad_case_search, "executor_for", lambda cluster: executor)
        return executor
    return install


def test_an_error_that_is_not_qirs_is_sent_to_the_other_ranks_and_raised_here_as_it_was(ranks):
    executor = ranks(theirs=([0.5], None))
    with pytest.raises(RuntimeError, match="out of memory in a kernel"):
        bad_case_search.search_on_cluster(object(), Failing(), None, [{"x": 1}], tick=lambda: None)
    own, failure = executor.sent[-1]  # what rank 1 gets instead of scores: it stops too
    assert own is None and failure == ("error", "RuntimeError", "out of memory in a kernel")


def test_another_ranks_error_that_is_not_qirs_is_raised_here_naming_the_rank_and_its_kind(ranks):
    ranks(theirs=(None, ("error", "RuntimeError", "out of memory in a kernel")))

    class Scoring:
        def score(self, sample):
            return 0.5

    with pytest.raises(QirError, match="rank 1: RuntimeError: out of memory in a kernel"):
        bad_case_search.search_on_cluster(object(), Scoring(), None, [{"x": 1}], tick=lambda: None)
