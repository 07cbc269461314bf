"""Graph overlays as Google AI Edge Model Explorer node data, and Model Explorer itself.

:func:`node_data` builds one overlay's node data with the package's own
``model_explorer.node_data_builder`` (so the format is right by construction): values keyed by
node id, which for Model Explorer's ONNX adapter (``model-explorer-onnx``) is the ONNX node's
name, i.e. the op's name in the IR and in the model qir saves, in a graph whose id is the ONNX
graph's name. Numbers get a gradient from the best value (pale) to the worst (dark red), whichever
end that is; a categorical overlay (a precision) gets one colour per category.

The one rule for every analysis (runall, compare, tune, consistency): with the ``viz`` extra
installed, every overlay its report draws on the graph is also written, always, as
``model_explorer/<key>.json`` beside the analysis's JSON, through :func:`write_overlays` (the one
writer); the command plans those files first (:func:`files`). Without the extra nothing is
written and one log line says why. :func:`start` serves a model with such files on localhost
(``qir view``); :func:`node_data_files` finds them in result folders, each folder's lead overlay
(:data:`LEAD`) first.

:func:`node_data` and :func:`start` need the ``viz`` extra; without it :func:`available` is False
and they raise one :class:`~qir.errors.InputError` that says what to install.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from qir.errors import InputError
from qir.tools.reports.graph_panel import CATEGORY_COLOURS, SCALE, Overlay, finite_values
from qir.tools.reports.plots import safe_filename

__all__ = ["NEEDS_VIZ", "FOLDER", "LEAD", "available", "node_data", "file_name", "files", "write_overlays",
           "node_data_files", "start"]

logger = logging.getLogger(__name__)

NEEDS_VIZ = "needs the viz extra (Model Explorer and its ONNX adapter): pip install 'qir[viz]'"
FOLDER = "model_explorer"
#: The overlay each analysis shows first (where the model goes wrong most), in a folder's files:
#: runall's worst sensitivity of any quantizer, compare's layer cosine, tune's precision, the
#: consistency check's deviation (from fake quantization, or from onnxruntime).
LEAD = ("sensitivity", "layer_cosine", "precision", "consistency_step", "ort_step")


def available() -> bool:
    """Whether Model Explorer and its ONNX adapter are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("model_explorer", "model_explorer_onnx"))


def _need() -> None:
    if not available():
        raise InputError(f"Model Explorer is not installed: qir view and Model Explorer node data {NEEDS_VIZ}")


def node_data(overlay: Overlay, graph_id: str) -> Any:
    """``overlay`` as a ``model_explorer.node_data_builder.ModelNodeData`` for the graph ``graph_id``."""
    _need()
    from model_explorer import node_data_builder as ndb

    if overlay.categorical:
        cats = list(overlay.categories) or sorted({str(v) for v in overlay.values.values()})
        colours = {c: CATEGORY_COLOURS[i % len(CATEGORY_COLOURS)] for i, c in enumerate(cats)}
        results = {n: ndb.NodeDataResult(value=cats.index(str(v)), bgColor=colours[str(v)])
                   for n, v in overlay.values.items() if str(v) in colours}
        gradient = []
    else:
        results = {n: ndb.NodeDataResult(value=v) for n, v in finite_values(overlay.values).items()}
        stops = SCALE if overlay.better == "min" else tuple(reversed(SCALE))  # stop 0: the smallest value
        gradient = [ndb.GradientItem(stop=k / (len(stops) - 1), bgColor=c) for k, c in enumerate(stops)]
    graph = ndb.GraphNodeData(results=results, gradient=gradient, name=overlay.name)
    return ndb.ModelNodeData(graphsData={graph_id: graph})


def _file(key: str) -> str:
    return f"{FOLDER}/{safe_filename(key)}.json"


def file_name(overlay: Overlay) -> str:
    """The file an overlay is written to, under :data:`FOLDER`: its key (or name)."""
    return _file(overlay.key or overlay.name)


def files(keys: Iterable[str]) -> list[str]:
    """The node data files of the overlays with these ``keys``, for a command to plan before it
    runs (:meth:`~qir.tools.reports.output.Outputs.plan`); none without the viz extra."""
    return [_file(k) for k in keys] if available() else []


def write_overlays(out: Any, overlays: Iterable[Overlay], graph_id: str) -> list[Path]:
    """Each overlay that has a value as node data, ``model_explorer/<key>.json``, through ``out``
    (an :class:`~qir.tools.reports.output.Outputs`); nothing (and a log line) without the viz
    extra. Returns the files written."""
    if not available():
        logger.info("no Model Explorer node data: it %s", NEEDS_VIZ)
        return []
    return [out.write_text(file_name(o), node_data(o, graph_id).to_json_string(indent=1))
            for o in overlays if (o.values if o.categorical else finite_values(o.values))]


def _lead_first(path: Path) -> tuple[int, str]:
    return (LEAD.index(path.stem) if path.stem in LEAD else len(LEAD), str(path))


def node_data_files(paths: Iterable[str | Path]) -> list[Path]:
    """The node data files named by ``paths``: a ``.json`` file as it is, a folder's
    ``model_explorer/*.json`` (at any depth; each folder's :data:`LEAD` overlay first). A path
    that is neither is one clear error."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file() and p.suffix == ".json":
            found.append(p)
        elif p.is_dir():
            here = sorted((f for f in p.rglob("*.json") if f.parent.name == FOLDER), key=_lead_first)
            if not here:
                raise InputError(f"{p}: no Model Explorer node data in it (no {FOLDER}/*.json: run runall, compare, "
                                 "tune or consistency -o with the viz extra installed, which write them beside "
                                 "their reports)")
            found += here
        else:
            raise InputError(f"{p}: not a folder of results or a node data .json file")
    return found


def start(model: str | Path, data: Iterable[Path], *, host: str = "localhost", port: int = 8080,
          open_browser: bool = False, announce: Callable[[str], None] = print) -> None:
    """Serve ``model`` in Model Explorer with the node ``data`` files on ``host:port``; ``announce``
    gets the URL that opens them (the model and overlays ride in its query) before the server
    blocks until interrupted. Model Explorer colours by the overlay added last, so the files are
    added last to first: the first one given (runall's worst of any quantizer) is shown."""
    _need()
    import model_explorer

    config = model_explorer.config().add_model_from_path(str(Path(model).resolve()))
    for f in reversed(list(data)):
        config.add_node_data_from_path(str(Path(f).resolve()))
    announce(f"http://{host}:{port}/?data={config.to_url_param_value()}")
    model_explorer.visualize_from_config(config, host=host, port=port, extensions=["model_explorer_onnx"],
                                         no_open_in_browser=not open_browser)
