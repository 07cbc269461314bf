"""``qir diff A B``: two result folders of the same command (sensitivity, compare, tune) side by
side: what moved beyond its interval, what appeared or vanished, the headline metrics
(:mod:`qir.tools.diff`)."""
from __future__ import annotations

import argparse
import sys

from qir.tools.cli.options import add_force

ORDER = 75  # after compare: it reads what the analyses wrote


def cmd_diff(args: argparse.Namespace) -> int:
    from qir.tools.diff import diff_runs, load_run
    from qir.tools.reports import diff as report
    from qir.tools.reports.output import Outputs

    out = Outputs(args.output, overwrite=args.force).plan(*report.FILES).check() if args.output else None
    d = diff_runs(load_run(args.a), load_run(args.b))
    sys.stdout.write(report.format_text(d))
    if out is not None:
        report.write_report(d, out)
        print(f"wrote {', '.join(report.FILES)} to {args.output}")
    return 0


def add_commands(sub) -> None:
    """``diff``."""
    what = ("two result folders of the same command (qir sensitivity, compare or tune) side by side: the rows "
            "that moved beyond their bootstrap intervals, those that appeared or vanished, the headline metrics")
    p = sub.add_parser("diff", help=what, description=what)
    p.add_argument("a", help="the first result folder (e.g. before a fix)")
    p.add_argument("b", help="the second result folder (e.g. after it)")
    p.add_argument("-o", "--output", help="also write diff.txt, diff.html and diff.json to this folder")
    add_force(p)
    p.set_defaults(func=cmd_diff)
