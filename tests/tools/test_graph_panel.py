"""The reports' graph panel (layout, colours, overlays, the page's data) and Model Explorer's
node data, without a browser (tests/tools/test_graph_browser.py drives one)."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import qir
from qir.errors import InputError
from qir.passes import PassManager, get_pass
from qir.tools.cli import main
from qir.tools.reports import model_explorer
from qir.tools.reports.compare import _overlays as compare_overlays
from qir.tools.reports.graph_layout import NODE_H, NODE_W, graphviz, layered, layout
from qir.tools.reports.graph_panel import NO_VALUE, SCALE, GraphNode, ModelGraph, Overlay, badness, block_of, colour, panel
from qir.tools.reports.overlays import tune_overlays
from qir.tools.reports.runall import _overlays as runall_overlays

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
HAS_DOT = shutil.which("dot") is not None


@pytest.fixture(scope="module")
def digits():
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DIGITS / "calibration_data", method="max", progress=False)(ir)
    return ir


def _diamonds(n: int) -> tuple[list[str], list[tuple[str, str]]]:
    """``n`` stacked diamonds a -> (b, c) -> d with a skip a -> d: branches, joins, a long edge."""
    nodes, edges = [], []
    for k in range(n):
        a, b, c, d = (f"{k}{s}" for s in "abcd")
        nodes += [a, b, c, d]
        edges += [(a, b), (a, c), (b, d), (c, d), (a, d)]
        if k:
            edges.append((f"{k - 1}d", a))
    return nodes, edges


def _check_layout(lay, nodes, edges):
    assert set(lay.positions) == set(nodes)
    for a, b in edges:  # top to bottom: every edge goes down
        assert lay.positions[b][1] > lay.positions[a][1] + NODE_H / 2
    for i, n in enumerate(nodes):  # no two boxes overlap
        x, y = lay.positions[n]
        assert NODE_W / 2 <= x + 1e-6 and x <= lay.width - NODE_W / 2 + 1e-6 and 0 <= y <= lay.height
        for m in nodes[i + 1:]:
            u, v = lay.positions[m]
            assert abs(x - u) >= NODE_W - 1e-6 or abs(y - v) >= NODE_H - 1e-6, (n, m)


def test_layered_layout_goes_down_without_overlaps():
    nodes, edges = _diamonds(5)
    lay = layered(nodes, edges)
    _check_layout(lay, nodes, edges)
    assert lay.engine == "layered"
    assert lay.positions["0b"][1] == lay.positions["0c"][1]  # the two branches side by side


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz dot is not installed")
def test_graphviz_layout_goes_down_without_overlaps():
    nodes, edges = _diamonds(5)
    lay = graphviz(nodes, edges)
    _check_layout(lay, nodes, edges)
    assert lay.engine == "dot" and layout(nodes, edges).engine == "dot"


def test_layout_falls_back_without_dot(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    nodes, edges = _diamonds(2)
    assert layout(nodes, edges).engine == "layered"


def test_odd_names_reach_dot_and_back():
    nodes = ['a "quoted" name', "b\\slash", "/model.0/conv/Conv", "c;d -> e"]
    edges = list(zip(nodes, nodes[1:]))
    for engine in ("layered", *(["dot"] if HAS_DOT else [])):
        _check_layout(layout(nodes, edges, engine=engine), nodes, edges)


def test_model_graph_joins_ops_through_quantizers(digits):
    graph = ModelGraph.from_ir(digits)
    ops = [o.name for o in digits.ops()]
    assert [n.name for n in graph.nodes] == ops and graph.name == digits.name
    fed = graph.op_of()
    for c in digits.calibrations():  # every quantizer is listed with the ops it feeds
        assert sorted(fed[c.name]) == sorted(c.feeds)
    for a, b in graph.edges:  # an edge: an output of a reaches b through quantizers only
        assert a in ops and b in ops
    reached = {b for _, b in graph.edges}
    assert all(op.name in reached for op in digits.ops()[1:])  # a chain: every op after the first is reached


def test_badness_ranks_the_worst_darkest_either_way():
    cos = Overlay("c", {"a": 1.0, "b": 0.99, "c": 0.5, "d": float("nan")}, "max")
    err = Overlay("e", {"a": 0.0, "b": 0.01, "c": 0.5}, "min")
    for o in (cos, err):
        t = badness(o)
        assert t["a"] == 0.0 and t["c"] == 1.0 and 0 < t["b"] < 1 and "d" not in t
        assert o.worst() == "c"
    assert colour(0.0) == SCALE[0] and colour(1.0) == SCALE[-1]
    skewed = Overlay("s", {f"n{k}": 1 - 1e-6 * (k + 1) for k in range(50)} | {"bad": 0.9}, "max")
    assert badness(skewed)["n25"] > 0.1  # log scale (linear: 0.0003): the many small ones are not all white beside one outlier
    assert badness(Overlay("u", {"a": 0.0, "b": 0.5, "c": 1.0}, "min"))["b"] == pytest.approx(0.5)  # linear otherwise


def _data(page: str) -> dict:
    blob = re.search(r"<script type='application/json' class='qg-data'>(.*?)</script>", page, re.S).group(1)
    return json.loads(blob.replace("<\\/", "</"))


def test_panel_data_has_every_op_and_its_colour(digits):
    graph = ModelGraph.from_ir(digits)
    some = {n.name: float(k) for k, n in enumerate(graph.nodes) if k % 2}
    page = panel(graph, [Overlay("err", some, "min")], engine="layered")
    data = _data(page)
    assert [n[0] for n in data["nodes"]] == [n.name for n in graph.nodes]
    ov = data["overlays"][0]
    for k, n in enumerate(graph.nodes):
        assert (ov["colours"][k] == NO_VALUE) == (n.name not in some)
    worst = max(some, key=some.get)
    assert ov["t"][[n.name for n in graph.nodes].index(worst)] == 1.0
    assert data["overlays"][0]["name"] == "err" and data["engine"] == "layered"
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from the network


def test_blocks_collapse_repeated_paths_and_keep_the_worst():
    names = [f"/model.{k}/{part}" for k in range(20) for part in ("conv/Conv", "act/Sigmoid", "act/Mul", "Add")] + ["head"]
    key = block_of(names)
    assert key["/model.3/act/Mul"] == "/model.3" and key["head"] == "head" and len(set(key.values())) == 21
    assert block_of([f"p2o.Conv.{k}" for k in range(60)]) is None  # no paths: no blocks
    graph = ModelGraph(tuple(GraphNode(n, n.rsplit("/", 1)[-1]) for n in names), tuple(zip(names, names[1:])))
    values = {n: 1.0 for n in names} | {"/model.7/act/Sigmoid": 0.5, "/model.2/conv/Conv": 0.9}
    blocks = _data(panel(graph, [Overlay("cos", values, "max")], engine="layered"))["blocks"]
    assert len(blocks["nodes"]) == 21 and len(blocks["edges"]) == 20  # a chain of blocks
    shown = dict(zip((b[0] for b in blocks["nodes"]), blocks["overlays"][0]["values"]))
    assert shown["/model.7"] == 0.5 and shown["/model.2"] == 0.9 and shown["/model.0"] == 1.0
    worst = max(range(21), key=lambda i: blocks["overlays"][0]["t"][i])
    assert blocks["nodes"][worst][0] == "/model.7" and names.index("/model.7/act/Sigmoid") in blocks["nodes"][worst][4]


def test_runall_overlays_put_quantizer_values_on_their_ops(digits):
    graph = ModelGraph.from_ir(digits)
    acts = [c for c in digits.calibrations("activation") if c.feeds]
    rows = [{"node": c.name, "cosine-similarity": 1.0 - 0.01 * k} for k, c in enumerate(acts)]
    results = {"sensitivity": {"activation": {"metrics": ["cosine-similarity"], "rows": rows},
                               "weight": {"metrics": ["cosine-similarity"], "rows": []}}}
    first = runall_overlays(results, graph)[0]
    assert first.key == "sensitivity" and first.better == "max"
    assert first.worst() in acts[-1].feeds
    precision = tune_overlays({acts[0].name: "int16"}, graph)[0]
    assert precision.categorical and set(precision.values) == set(acts[0].feeds)


def test_compare_overlays_read_rows_by_op(digits):
    graph = ModelGraph.from_ir(digits)
    ops = [n.name for n in graph.nodes]
    rows = [{"mod_name": ops[0], "Cosine": 0.9, "clip%": 0.0}, {"mod_name": ops[1] + "[0]", "Cosine": 0.5, "clip%": 2.0}]
    cos, clip = compare_overlays({}, rows, graph)[:2]
    assert cos.values == {ops[0]: 0.9, ops[1]: 0.5} and cos.worst() == ops[1] and clip.worst() == ops[1]


@pytest.mark.browser  # needs the viz extra: runs in CI's second pass with the browser tests
@pytest.mark.skipif(not model_explorer.available(), reason=model_explorer.NEEDS_VIZ)
def test_model_explorer_node_data_is_keyed_by_the_adapters_node_ids(digits, tmp_path):
    from model_explorer_onnx.main import ONNXAdapter

    path = tmp_path / "digits.onnx"
    qir.save(digits, path)
    me_graph = ONNXAdapter().convert(str(path), {})["graphs"][0]
    graph = ModelGraph.from_ir(digits)
    values = {n.name: float(k) for k, n in enumerate(graph.nodes)}
    doc = json.loads(model_explorer.node_data(Overlay("err", values, "min"), graph.name).to_json_string())
    assert list(doc) == [me_graph.id]
    assert set(doc[me_graph.id]["results"]) <= {n.id for n in me_graph.nodes}
    stops = doc[me_graph.id]["gradient"]
    assert stops[0]["bgColor"] == SCALE[0] and stops[-1]["bgColor"] == SCALE[-1]  # error: the largest is darkest
    cos = json.loads(model_explorer.node_data(Overlay("c", values, "max"), graph.name).to_json_string())
    assert cos[me_graph.id]["gradient"][0]["bgColor"] == SCALE[-1]  # cosine: the smallest is darkest


def test_node_data_files_and_qir_view_errors(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no Model Explorer node data"):
        model_explorer.node_data_files([tmp_path / "empty"])
    with pytest.raises(InputError, match="not a folder of results"):
        model_explorer.node_data_files([tmp_path / "missing"])
    assert main(["view", str(tmp_path / "nothing.onnx")]) != 0
    assert "no such model file" in capsys.readouterr().err
    monkeypatch.setattr(model_explorer, "available", lambda: False)
    assert main(["view", str(DIGITS / "model.onnx")]) != 0
    err = capsys.readouterr().err
    assert "viz extra" in err and "pip install" in err and "Traceback" not in err
    with pytest.raises(InputError, match="viz extra"):
        model_explorer.node_data(Overlay("x", {"a": np.float64(1.0)}), "g")


def test_compare_and_consistency_pages_draw_the_analysis_model(digits, tmp_path):
    model = tmp_path / "cal.onnx"
    qir.save(digits, model)
    out = tmp_path / "qa"
    assert main(["compare", str(DIGITS / "model.onnx"), str(model), str(DIGITS / "calibration_data"), "-o", str(out),
                 "-n", "4", "-m", "cosine", "--consistency"]) == 0
    data = _data((out / "index.html").read_text())
    assert [n[0] for n in data["nodes"]] == [o.name for o in digits.ops()]
    names = [o["name"] for o in data["overlays"]]
    assert names[:2] == ["layer output cosine", "clipping share (%)"] and "integer vs fake-quant: cosine" in names
    cosine = dict(zip((n[0] for n in data["nodes"]), data["overlays"][0]["values"]))
    rows = {r["mod_name"]: r["Cosine"] for r in json.loads((out / "compare_per_layer_out.json").read_text())["rows"]}
    assert all(cosine[op] == pytest.approx(c, rel=1e-5) for op, c in rows.items() if op in cosine)
    worst = min(rows, key=rows.get)
    assert f'<tr data-node="{worst}">' in (out / "index.html").read_text()  # the worst layer's row: a click lands there
    assert main(["consistency", str(model), str(DIGITS / "calibration_data"), "-o", str(tmp_path / "c"), "-n", "2"]) == 0
    page = _data((tmp_path / "c" / "consistency_result.html").read_text())
    assert page["overlays"][0]["name"] == "integer vs fake-quant: own max step"
    assert any(v is not None for v in page["overlays"][0]["values"])
