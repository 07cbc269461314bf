"""numpy kernels, grouped by family; importing this package registers all of them."""
from __future__ import annotations

from . import activation  # noqa: F401
from . import conv  # noqa: F401
from . import elementwise  # noqa: F401
from . import linalg  # noqa: F401
from . import norm  # noqa: F401
from . import pool  # noqa: F401
from . import reduce  # noqa: F401
from . import resize  # noqa: F401
from . import shape  # noqa: F401
