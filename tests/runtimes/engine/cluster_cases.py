"""What the executor tests (``test_cluster*.py``) share: the variants they run, the rows an
``engine_results.jsonl`` holds, and the fault they inject (a worker that dies mid-shard)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from qir.runtimes.engine import Variant, one_at_a_time


def cluster_variants(ir) -> list[Variant]:
    """Every quantizer alone in int8, plus one two-node variant (int8 and int16)."""
    acts = [c.name for c in ir.calibrations("activation")]
    return one_at_a_time(ir, "int8", "all") + [Variant("pair", {acts[1]: "int8", acts[-2]: "int16"})]


def saved_rows(path: Path) -> list[dict]:
    """The rows of a results file (its first line is the header)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()[1:]]


def dying(shard_fn: Callable[[Any, Any], Iterator[tuple]], marker: str | Path,
          is_worker: Callable[[], bool]) -> Callable[[Any, Any], Iterator[tuple]]:
    """``shard_fn`` (a shard function, e.g. the engine's) with a fault: the first process for which
    ``is_worker()`` holds to have sent rows while the file ``marker`` does not exist creates it and
    dies at once (``os._exit``), as a killed worker would; every later one carries on. The tests
    put it in place of ``qir.runtimes.engine.distributed.engine_shard``."""
    marker = str(marker)

    def shard(common: Any, task: Any) -> Iterator[tuple]:
        for message in shard_fn(common, task):
            yield message  # sent once the worker asks for the next message
            if message[0] == "rows" and message[1] and is_worker():
                try:
                    open(marker, "x").close()
                except FileExistsError:
                    continue
                os._exit(3)

    return shard
