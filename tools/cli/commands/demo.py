"""``qir demo``: qir on the bundled digits example."""
from __future__ import annotations

import argparse
from pathlib import Path

from qir.tools.cli.options import add_force, add_runtime

ORDER = 90


def cmd_demo(args: argparse.Namespace) -> int:
    from qir.tools.demo import run_demo

    out = Path(args.output) if args.output else None
    return run_demo(out, runtimes=["numpy", "ort"] if args.runtime == "both" else [args.runtime], overwrite=args.force)


def add_commands(sub) -> None:
    """``demo``."""
    p = sub.add_parser("demo", help="run qir on the bundled digits example")
    p.add_argument("-o", "--output", help="folder for the demo's files (dumps, outputs)")
    add_runtime(p, default="both", choices=("numpy", "ort", "both"))
    add_force(p)
    p.set_defaults(func=cmd_demo)
