"""``qir consistency``: fake quantization vs what a march's NPU computes (the integer level)."""
from __future__ import annotations

import argparse
import sys

from qir.tools.cli.options import NODE_DATA_HELP, add_data_num, add_force, add_march

ORDER = 62


def cmd_consistency(args: argparse.Namespace) -> int:
    from qir.tools.consistency import check_against_ort, check_consistency
    from qir.tools.reports.consistency import format_ort_report, format_report

    if args.against == "ort":
        comparison = check_against_ort(args.model, args.data, march=args.march, num=args.data_num,
                                       save_dir=args.save_dir, overwrite=args.force)
        sys.stdout.write(format_ort_report(comparison))
        if args.save_dir:
            print(f"wrote ort_consistency.txt and .json to {args.save_dir}")
        return 0

    report = check_consistency(args.model, args.data, march=args.march or "nash-e", num=args.data_num, save_dir=args.save_dir,
                               overwrite=args.force)
    sys.stdout.write(format_report(report))
    if args.save_dir:
        print(f"wrote consistency_result.txt and .json to {args.save_dir}")
    return 0


def add_commands(sub) -> None:
    """``consistency``."""
    p = sub.add_parser("consistency", help="fake quantization vs what the march's NPU computes (integer level), "
                                           "value by value: where codes differ, by how many steps, and why")
    p.add_argument("model", help="a calibrated model (.onnx with calibration nodes, or a QDQ model)")
    p.add_argument("data", help="a data folder, .npy or .npz with the model's inputs")
    add_march(p, help="the march whose integer arithmetic to emulate (nash-e, nash-m, nash-p, generic, ort)")
    add_data_num(p, default=4, help="samples to compare (default 4)", old=("-n", "--num"))
    p.add_argument("-o", "--output", "-s", "--save-dir", dest="save_dir",
                   help="write consistency_result.txt, .json and .html (with --against ort: ort_consistency.txt and "
                        f".json) to this folder; {NODE_DATA_HELP}")
    p.add_argument("--against", choices=("fakequant", "ort"), default="fakequant",
                   help="what to compare the integer level with: the model's fake quantization (default), or "
                        "onnxruntime's default CPU session on a QDQ model (its integer kernels; names the first op "
                        "whose codes differ and the kernel onnxruntime ran for it; --march defaults to ort)")
    add_force(p)
    p.set_defaults(func=cmd_consistency, march=None)  # nash-e, or ort with --against ort
