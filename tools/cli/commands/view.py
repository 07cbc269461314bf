"""``qir view``: a model in Google's AI Edge Model Explorer on localhost, with qir's analyses as
node-data overlays (:mod:`qir.tools.reports.model_explorer`; needs the ``viz`` extra)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ORDER = 75  # after the analyses whose overlays it shows


def _matched(model: Path, files: list[Path]) -> list[str]:
    """One line per node data file: its overlay name and how many of its nodes the model has
    (a file made for another model matches none, which Model Explorer would show as no colour)."""
    import onnx

    from qir.errors import InputError

    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001 - any reason the file is not an ONNX model
        raise InputError(f"{model}: not an ONNX model Model Explorer can read ({exc})") from exc
    names = {n.name for n in graph.node}
    lines = []
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{f}: not a Model Explorer node data file ({exc})") from exc
        for gid, g in (doc.items() if "results" not in doc else [(graph.name, doc)]):
            keys = set((g.get("results") or {}))
            hit = len(keys & names)
            where = "" if gid == graph.name else f"; made for the graph {gid!r}, the model's is {graph.name!r}"
            lines.append(f"  {g.get('name') or f.stem}: {hit} of {len(keys)} nodes found in the model{where}")
    return lines


def cmd_view(args: argparse.Namespace) -> int:
    from qir.errors import InputError
    from qir.tools.reports import model_explorer

    model = Path(args.model)
    if not model.is_file():
        raise InputError(f"{model}: no such model file (qir view MODEL [RESULT_DIR ...])")
    if not model_explorer.available():
        raise InputError(f"qir view {model_explorer.NEEDS_VIZ}")
    files = model_explorer.node_data_files(args.results)
    print(f"{model}: {len(files)} overlay(s)")
    for line in _matched(model, files):
        print(line)
    model_explorer.start(model, files, host=args.host, port=args.port, open_browser=args.open,
                         announce=lambda url: print(f"Model Explorer (Ctrl-C stops it): {url}", flush=True))
    return 0


def add_commands(sub) -> None:
    """``view``."""
    p = sub.add_parser("view", help="a model in Model Explorer with qir's analyses as overlays (needs the viz extra)",
                       description="Start Google's AI Edge Model Explorer on localhost with MODEL and the node data "
                                   "(model_explorer/*.json) that runall, compare, tune and consistency write beside their "
                                   "reports, each folder's lead overlay shown first; "
                                   "prints the URL. Needs: pip install 'qir[viz]'.")
    p.add_argument("model", help="the .onnx model the analyses ran on (the calibrated model, as qir saves it)")
    p.add_argument("results", nargs="*", help="result folders (their model_explorer/*.json) or node data .json files")
    p.add_argument("--host", default="localhost", help="the address to serve on (default: localhost)")
    p.add_argument("--port", type=int, default=8080, help="the port (default: 8080)")
    p.add_argument("--open", action="store_true", help="also open it in the default browser")
    p.set_defaults(func=cmd_view)
