"""``qir demo``: qir on the bundled digits example."""
from __future__ import annotations

import argparse
from pathlib import Path

from qir.errors import InputError
from qir.tools.cli.options import add_force, add_runtime

ORDER = 90


def cmd_demo(args: argparse.Namespace) -> int:
    from qir.tools.demo import run_demo

    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out} exists and is not empty; choose another folder or pass --force")
    return run_demo(out, runtimes=["numpy", "ort"] if args.runtime == "both" else [args.runtime])


def add_commands(sub) -> None:
    """``demo``."""
    p = sub.add_parser("demo", help="run qir on the bundled digits example")
    p.add_argument("-o", "--output", help="folder for the demo's files (dumps, outputs)")
    add_runtime(p, default="both", choices=("numpy", "ort", "both"))
    add_force(p, help="write into a non-empty folder")
    p.set_defaults(func=cmd_demo)
