"""``python -m qir.tools.cli`` runs the ``qir`` command line."""
import sys

from qir.tools.cli.app import main

sys.exit(main())
