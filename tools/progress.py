"""Long work shown to a person: progress bars on terminals, nothing when the output is piped."""
from __future__ import annotations

from qir.runtimes.base import get_runtime

__all__ = ["run_samples"]


def run_samples(ir, samples, runtime: str, *, desc: str = "run", capture=(),
                level: str = "fakequant") -> list[dict]:
    """Run every sample with a progress bar on stderr (shown on terminals only)."""
    from tqdm import tqdm

    rt = get_runtime(runtime, level=level)
    return [rt.run(ir, s, capture=capture)
            for s in tqdm(samples, desc=desc, unit="sample", disable=None, leave=False)]
