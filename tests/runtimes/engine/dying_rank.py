"""``qir ARGS`` on a rank of a torchrun job, with the fault of :func:`cluster_cases.dying`: the first
rank other than 0 to send rows while the file ``$QIR_TEST_DYING_MARKER`` does not exist creates it
and dies. ``test_cluster_torch.py`` runs it as ``torchrun ... dying_rank.py ARGS --cluster torch``."""
import os
import sys

import torch.distributed as dist
from cluster_cases import dying

from qir.runtimes.engine import distributed
from qir.tools.cli import main

if __name__ == "__main__":
    distributed.engine_shard = dying(distributed.engine_shard, os.environ["QIR_TEST_DYING_MARKER"],
                                     lambda: dist.get_rank() != 0)
    sys.exit(main(sys.argv[1:]))
