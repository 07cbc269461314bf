"""numpy kernels, grouped by family; importing this package registers all of them."""
from __future__ import annotations

from qir.runtimes.numpy_ref.kernels import (
    activation,  # noqa: F401
    conv,  # noqa: F401
    elementwise,  # noqa: F401
    linalg,  # noqa: F401
    norm,  # noqa: F401
    pool,  # noqa: F401
    reduce,  # noqa: F401
    resize,  # noqa: F401
    shape,  # noqa: F401
)
