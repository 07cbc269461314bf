"""``qir check``: what a model's structure and calibration config may cost in accuracy."""
from __future__ import annotations

import argparse
import sys

from qir.tools.cli.options import add_force, add_march

ORDER = 60


def cmd_check(args: argparse.Namespace) -> int:
    from qir.tools.model_check import check_model
    from qir.tools.reports.model_check import format_report

    report = check_model(args.model, march=args.march, save_dir=args.save_dir, overwrite=args.force)
    sys.stdout.write(format_report(report))
    if args.save_dir:
        print(f"wrote model_check_result.txt and .json to {args.save_dir}")
    return 0


def add_commands(sub) -> None:
    """``check`` (alias ``check-model``)."""
    p = sub.add_parser("check", aliases=["check-model"],
                       help="unfused patterns, shared weights/modules, per-op calibration config, unusual configs")
    p.add_argument("model", help="an .onnx model (float, calibrated or QDQ)")
    add_march(p)
    p.add_argument("-o", "--output", "-s", "--save-dir", dest="save_dir",
                   help="write model_check_result.txt and .json to this folder")
    add_force(p)
    p.set_defaults(func=cmd_check)
