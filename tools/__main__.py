"""``python -m qir.tools`` runs the ``qir`` command line."""
import sys

from .cli import main

sys.exit(main())
