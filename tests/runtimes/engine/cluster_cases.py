"""What the executor tests (``test_cluster*.py``) share: the variants they run and the rows an
``engine_results.jsonl`` holds."""
from __future__ import annotations

import json
from pathlib import Path

from qir.runtimes.engine import Variant, one_at_a_time


def cluster_variants(ir) -> list[Variant]:
    """Every quantizer alone in int8, plus one two-node variant (int8 and int16)."""
    acts = [c.name for c in ir.calibrations("activation")]
    return one_at_a_time(ir, "int8", "all") + [Variant("pair", {acts[1]: "int8", acts[-2]: "int16"})]


def saved_rows(path: Path) -> list[dict]:
    """The rows of a results file (its first line is the header)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()[1:]]
