"""``qir profiles``: the march profiles and which of their parameters are assumed."""
from __future__ import annotations

import argparse
import sys

ORDER = 80


def cmd_profiles(args: argparse.Namespace) -> int:
    from qir.runtimes.march import format_profiles

    sys.stdout.write(format_profiles(args.names or None, notes=args.notes))
    return 0


def add_commands(sub) -> None:
    """``profiles``."""
    p = sub.add_parser("profiles", help="show the march profiles and which parameters are assumed")
    p.add_argument("names", nargs="*", help="profiles to show (default: all)")
    p.add_argument("--notes", action="store_true", help="show where each parameter comes from")
    p.set_defaults(func=cmd_profiles)
