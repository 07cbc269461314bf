"""``python -m qir.tools`` runs the ``qir`` command line."""
import sys

from qir.tools.cli import main

sys.exit(main())
