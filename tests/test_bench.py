"""The benchmark harness: traffic models, checks before timing, the CLI in reference mode, the asv suite.

Performance itself is measured by the harness, never asserted here.
"""

import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from _env import GPU
from tcgnn_py import TiledMatrix
from tcgnn_py.bench import bench_graph, distinct_window_columns, resolve_graph, traffic_bytes
from tcgnn_py.bench._report import summary
from tcgnn_py.bench._run import _measure
from tcgnn_py.bench._timing import time_queued

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_traffic_bounds_follow_the_issue_formulas():
    nnz, n, U, D = 1000, 77, 640, 48
    t = traffic_bytes(nnz, n, U, D)
    assert t["gather"] == nnz * (4 + 4) + 4 * nnz * D + 4 * n * D
    assert t["reuse"] == nnz * (4 + 4) + 4 * U * D + 4 * n * D


@pytest.mark.parametrize("spec", ["powerlaw:203:1500", "banded:77:3", "uniform:150:900"])
def test_distinct_window_columns_brute_force(spec):
    """U counts distinct (row // 16, column) pairs, rows not a multiple of 16 included."""
    _, A = resolve_graph(spec)
    rows, cols = A.nonzero()
    want = len(set(zip((rows // 16).tolist(), cols.tolist())))
    assert distinct_window_columns(TiledMatrix(A, layout="tcgnn")) == want


@pytest.mark.parametrize("spec,shape,nnz", [("banded:10:1", (10, 10), 28), ("uniform:50:300", (50, 50), 300)])
def test_synthetic_specs(spec, shape, nnz):
    name, A = resolve_graph(spec)
    assert name == spec and A.shape == shape and A.nnz == nnz and A.has_canonical_format


def test_bad_synthetic_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="powerlaw:N:K"):
        resolve_graph("powerlaw:many:5")
    with pytest.raises(FileNotFoundError):
        resolve_graph("no-such-graph")


def test_wrong_results_are_not_timed():
    """A product that disagrees with the baseline raises before any timing."""
    X = np.arange(12, dtype=np.float32).reshape(4, 3)
    impls = {"scipy": (lambda i: X, None), "tcgnn_ref": (lambda i: X + 1, None)}
    with pytest.raises(RuntimeError, match="tcgnn_ref: relative error"):
        _measure("spmm", impls, ["scipy"], 1, 1, False, lambda row: None)


def test_bench_graph_reference_mode():
    """``device=False`` runs the exact reference path, also where a GPU is usable."""
    g = bench_graph("powerlaw:300:2500", dims=(5, 16), repeat=2, n_inputs=2, device="cpu", copy_bw=1e10, seed=1)
    A = resolve_graph("powerlaw:300:2500")[1]
    assert (g["rows"], g["nnz"]) == (300, A.nnz)
    assert g["device"] == "cpu"
    assert g["blocks"] == TiledMatrix(A, layout="tcgnn", device="cpu").tile_stats().blocks  # "tcgnn_*": 16x8 tiles
    assert g["memory"]["csr_bytes"] == A.data.nbytes + A.indices.nbytes + A.indptr.nbytes
    assert [(r["op"], r["D"]) for r in g["results"]] == [("spmm", 5), ("sddmm", 5), ("spmm", 16), ("sddmm", 16)]
    for r in g["results"]:
        assert set(r["us"]) == set(r["us_back_to_back"]) == set(r["err"])
        assert all(v > 0 for v in r["us"].values())
        assert max(r["err"].values()) < 1e-5  # reference path vs SciPy / NumPy
        best = r["us"][r["best_baseline"]]
        assert r["speedup"]["tcgnn_ref"] == pytest.approx(best / r["us"]["tcgnn_ref"])
        assert r["gflops"]["tcgnn_ref"] == pytest.approx(2 * A.nnz * r["D"] / (r["us"]["tcgnn_ref"] * 1e3))
        b = r["bytes"]
        assert b == traffic_bytes(A.nnz, 300, g["U"], r["D"]) and b["reuse"] <= b["gather"]
        assert r["pct_of_copy"]["gather"]["tcgnn_ref"] == pytest.approx(
            100 * b["gather"] / (r["us"]["tcgnn_ref"] * 1e-6) / 1e10)


def test_summary_geomeans_per_clock():
    # Two points of ``tcgnn_a`` at 2x and 0.5x from idle: geomean 1x, one below 1x (the worst named).
    rows = [{"op": "spmm", "D": d, "us": {"tcgnn_a": 1.0, "base": 1.0}, "speedup": {"tcgnn_a": v},
             "speedup_gpu": {"tcgnn_a": 2 * v}} for d, v in ((8, 2.0), (16, 0.5))]
    lines = summary([{"graph": "g", "nnz": 10, "results": rows}])
    assert lines[0] == ("spmm tcgnn_a, one call from idle: geomean 1.00x over the best baseline at 2 points, "
                        "1 below 1.0x, worst 0.50x (g, D = 16)")
    assert lines[1].startswith("spmm tcgnn_a, GPU-only (queued): geomean 2.00x") and " 0 below 1.0x" in lines[1]
    assert summary([{"graph": "g", "nnz": 10, "results": rows}], min_nnz=11) == []


def test_cli_reference_mode(tmp_path):
    """``python -m tcgnn_py.bench --device cpu``: tables, JSON, markdown and plot on a tiny graph (what CI runs)."""
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "tcgnn_py.bench", "banded:60:2", "powerlaw:200:1500", "--device", "cpu",
           "--dims", "4,9", "--repeat", "2", "--inputs", "1", "--ops", "spmm,sddmm,reorder",
           "--json", str(out), "--markdown", str(tmp_path / "b.md")]
    if importlib.util.find_spec("matplotlib"):
        cmd += ["--plot", str(tmp_path / "b.png")]
    env = dict(os.environ, TCGNN_PY_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "== banded:60:2" in res.stdout and "spmm D=9" in res.stdout and "2:4" in res.stdout
    data = json.loads(out.read_text())
    assert data["env"]["copy_bandwidth_gbps"] > 0 and data["env"]["numpy"] == np.__version__
    assert [g["graph"] for g in data["graphs"]] == ["banded:60:2", "powerlaw:200:1500"]
    assert {r["graph"] for r in data["reorder"]} == {"banded:60:2", "powerlaw:200:1500"}
    md = (tmp_path / "b.md").read_text()
    assert "### SPMM" in md and "### SDDMM" in md and "### N:M reorder" in md and "| banded:60:2 | 294 | 9 |" in md
    if "--plot" in cmd:
        assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_the_epoch_tables_implementations_are_timed_in_turn():
    """Every implementation is built and warmed before any is timed, and each round times one batch of each, the
    order reversed every other round: a drift of the machine's speed during a run reaches them alike."""
    from tcgnn_py.bench._gnn import time_epochs_in_turn

    calls = []
    steps = {name: (lambda name=name: calls.append(name), lambda name=name: calls.append(name + " sync"))
             for name in ("a", "b")}
    ms = time_epochs_in_turn(steps, epochs=2, repeat=3, warmup=1, settled=False)
    assert set(ms) == {"a", "b"} and all(v >= 0 for v in ms.values())
    batches = [c for c, n in zip(calls, calls[1:]) if not c.endswith("sync") and n.endswith("sync")][2:]
    assert batches == ["a", "b", "b", "a", "a", "b"]  # (after one warm-up step of each)


def test_gnn_epochs_reference_mode(tmp_path):
    """``--ops gcn,agnn,gat``: one row per model and implementation (GAT has no scipy counterpart: its attention
    runs on the tiled matrix), in the JSON and the markdown table."""
    out = tmp_path / "g.json"
    cmd = [sys.executable, "-m", "tcgnn_py.bench", "cora", "powerlaw:300:2000", "--ops", "gcn,agnn,gat", "--device",
           "cpu", "--epochs", "1", "--json", str(out), "--markdown", str(tmp_path / "g.md")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["gnn"]
    assert {(r["graph"], r["model"], r["impl"]) for r in rows} == {
        (g, m, i) for g in ("cora", "powerlaw:300:2000") for m in ("gcn", "agnn", "gat") for i in ("tcgnn_ref", "scipy")
        if (m, i) != ("gat", "scipy")}
    assert all(r["ms"] > 0 for r in rows)
    cora = [r for r in rows if r["graph"] == "cora"][0]
    assert (cora["in_features"], cora["features"], cora["classes"]) == (1433, "real", 7)
    md = (tmp_path / "g.md").read_text()
    assert "| cora | 2,708 | 10,556 | 1433 (real) | gcn |" in md and "| cora | 2,708 | 10,556 | 1433 (real) | gat |" in md


def test_cli_rejects_unknown_ops():
    from tcgnn_py.bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["cora", "--ops", "spmm,gemm"])
    with pytest.raises(SystemExit):
        main(["cora", "--dtypes", "float16,int8"])


# --- asv suite -------------------------------------------------------------

sys.path.insert(0, str(ROOT / "asv_bench"))
ASV_MODULES = ["benchmarks.spmm", "benchmarks.sddmm", "benchmarks.preprocess", "benchmarks.reorder", "benchmarks.gnn",
               "benchmarks.host"]


def _asv_classes():
    for name in ASV_MODULES:
        mod = importlib.import_module(name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__:
                yield cls


def test_asv_config_is_valid_json5():
    import re

    text = (ROOT / "asv_bench" / "asv.conf.json").read_text()
    conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    assert conf["environment_type"] == "existing" and conf["repo"] == ".."
    assert (ROOT / "asv_bench" / conf["benchmark_dir"]).is_dir()


def test_asv_suite_shape():
    """Parameters match their names; every benchmark takes them, after the cache where the class has a
    setup_cache (asv passes no None cache); every track_ has a unit."""
    classes = list(_asv_classes())
    assert {c.__name__ for c in classes} >= {"SpMM", "SDDMM", "SGT", "Reorder", "TileQuality", "TrainEpoch",
                                             "CallCost", "LayerCallCost", "InputLayer", "HostPath"}
    for cls in classes:
        params = getattr(cls, "params", [])
        assert len(params) == len(getattr(cls, "param_names", [])), cls
        cached = hasattr(cls, "setup_cache")
        methods = [m for m in dir(cls) if m.startswith(("time_", "track_"))]
        assert methods, cls
        for m in methods + ["setup"] + (["teardown"] if hasattr(cls, "teardown") else []):
            fn = getattr(cls, m)
            assert len(inspect.signature(fn).parameters) == 1 + cached + len(params), (cls, m)
            if m.startswith("track_"):
                assert getattr(fn, "unit", None), (cls, m)


@pytest.mark.skipif(GPU, reason="checks the no-GPU path")
def test_asv_setup_without_gpu_reports_not_implemented():
    from benchmarks.spmm import SpMM, SpMMHalf

    cache = SpMM().setup_cache()
    assert cache == {}  # no graph generated for benchmarks that skip; not None, which asv would not pass
    for cls, args in ((SpMM, ("cora", 64, "tcgnn_tf32")), (SpMMHalf, ("cora", 64, "float16", "tcgnn_vector"))):
        b = cls()
        with pytest.raises(NotImplementedError, match="needs a CUDA GPU"):
            b.setup(cache, *args)
        b.teardown(cache, *args)  # asv tears a skipped setup down too


def test_asv_host_benchmarks_run():
    from benchmarks.host import HostPath

    b = HostPath()
    b.setup()
    b.time_translate()
    b.time_spmm()


# --- on the device -----------------------------------------------------------


@pytest.mark.gpu
def test_bench_graph_on_device():
    g = bench_graph("powerlaw:3001:20000", dims=(7, 64), repeat=3, n_inputs=2, copy_bw=4e12, seed=3)
    assert g["device"] == "cuda"
    for r in g["results"]:
        ours = {"tcgnn_tf32", "tcgnn_vector_tf32", "tcgnn_fp32"}
        want = {"spmm": {"cusparse_alg2", "cusparse_alg3", "cupyx"} | ours,
                "sddmm": {"cusparse_sddmm", "gather_dot"} | ours}[r["op"]]
        assert set(r["us"]) == want, g["notes"]
        assert r["err"]["tcgnn_tf32"] < 5e-3 and r["err"]["tcgnn_vector_tf32"] < 5e-3 and r["err"]["tcgnn_fp32"] < 1e-5
        assert set(r["speedup"]) == ours
        assert r["best_baseline"] in r["baselines"]
        # Three clocks, each implementation on each; the GPU-only one leaves the host's issue time out.
        assert set(r["us_gpu"]) == set(r["us_back_to_back"]) == set(r["us"])
        assert set(r["speedup_gpu"]) == set(r["speedup_back_to_back"]) == ours
        best_gpu = min(r["us_gpu"][b] for b in r["baselines"])
        assert r["speedup_gpu"]["tcgnn_vector_tf32"] == pytest.approx(best_gpu / r["us_gpu"]["tcgnn_vector_tf32"])
    lines = summary([g])
    assert any("GPU-only (queued)" in line for line in lines) and any("from idle" in line for line in lines)


@pytest.mark.gpu
def test_queued_clock_times_the_kernels_not_the_host():
    """``time_queued`` of a kernel that runs 50 µs reads about 50 µs per call, whatever the host spends issuing.

    The host spends 1 ms per call, twenty times the kernel: a clock that counted it would read over 1 ms.
    The upper bound leaves room for other processes sharing the GPU (parallel test workers), which stretch
    the kernels themselves.
    """
    import time

    from tcgnn_py.kernels.timing import spin

    def call(i):
        time.sleep(1e-3)  # host time per call, hidden behind the spin kernel
        spin(0.05)

    ms = time_queued(call, 2, calls=10, repeat=3)
    assert 0.045 <= ms <= 0.5, ms


@pytest.mark.gpu
def test_bench_graph_16bit_features_on_device():
    g = bench_graph("powerlaw:3001:20000", ops=("spmm",), dims=(64,), repeat=3, n_inputs=2, seed=3,
                    dtypes=("float32", "float16", "bfloat16"))
    (r,) = g["results"]
    for dt in ("float16", "bfloat16"):
        assert {f"tcgnn_vector_{dt}", f"cusparse_{dt}"} <= set(r["us"])
        assert r["err"][f"tcgnn_vector_{dt}"] < {"float16": 3e-3, "bfloat16": 2e-2}[dt]
        assert f"tcgnn_vector_{dt}" in r["speedup"] and dt in r["speedup_vs_16bit"]
    assert r["best_baseline"] in ("cusparse_alg2", "cusparse_alg3")  # speedups against cuSPARSE float32


@pytest.mark.gpu
def test_gather_dot_and_cusparse_sddmm_baselines_agree_with_numpy():
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from tcgnn_py.bench import CusparseSDDMM, GatherDotSDDMM

    A = sp.csr_array(resolve_graph("powerlaw:517:4000")[1], dtype=np.float32)
    A.indices, A.indptr = A.indices.astype(np.int64), A.indptr.astype(np.int64)  # cupyx keeps int64
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    for D in (1, 5, 32, 70):
        X = np.random.default_rng(D).integers(-4, 5, (A.shape[0], D)).astype(np.float32)
        want = np.einsum("ij,ij->i", X[rows], X[A.indices])
        for cls in (GatherDotSDDMM, CusparseSDDMM):
            out = cp.full(A.nnz, cp.nan, cp.float32)
            b = cls(csp.csr_matrix(A), [cp.asarray(X)], out)
            b(0)
            b.close()
            np.testing.assert_array_equal(out.get(), want, err_msg=f"{cls.__name__} D={D}")


@pytest.mark.gpu
def test_asv_benchmarks_run_one_call_each():
    """Every asv benchmark's setup and timed body on cora at D=64, as asv would call them."""
    from benchmarks import common

    graphs = common.load(["cora"])
    for cls in _asv_classes():
        own = cls.__name__ in ("TrainEpoch", "InputLayer")  # their own caches: the harness's problems
        cache = cls().setup_cache() if own else graphs
        cache = (cache,) if hasattr(cls, "setup_cache") else ()
        names = getattr(cls, "param_names", [])
        for combo in _first_combos(cls):
            if "graph" in names:
                combo = tuple("cora" if n == "graph" else v for n, v in zip(names, combo))
            if "D" in names:
                combo = tuple(64 if n == "D" else v for n, v in zip(names, combo))
            b = cls()
            b.setup(*cache, *combo)
            for m in dir(cls):
                if m.startswith(("time_", "track_")):
                    getattr(b, m)(*cache, *combo)
            if hasattr(b, "teardown"):
                b.teardown(*cache, *combo)


def _first_combos(cls):
    """Every value of the last parameter, the first value of the others."""
    import itertools

    params = getattr(cls, "params", [])
    if not params:
        return [()]
    firsts = [[p[0]] for p in params[:-1]]
    return itertools.product(*firsts, params[-1])


@pytest.mark.parametrize("order", ["locality", "rcm", "degree"])
def test_bench_graph_vertex_orders_reference_mode(order):
    from tcgnn_py.bench._run import vertex_order

    A = resolve_graph("powerlaw:300:2500")[1]
    p, seconds = vertex_order(A, order, device="cpu")
    assert sorted(p.perm) == list(range(300)) and seconds >= 0
    g = bench_graph("powerlaw:300:2500", ops=("spmm",), dims=(4,), repeat=1, n_inputs=1, device="cpu", order=order)
    assert g["order"]["order"] == order and set(g["order"]["pairs_per_nnz_before"]) == {"tcgnn", "vector"}
    # the measured graph is the renumbered one
    from tcgnn_py import locality_report

    want = p.report if order == "locality" else locality_report(p.apply(A), device="cpu")
    assert g["locality"]["tcgnn"]["pairs_per_nnz"] == want["tcgnn"].pairs_per_nnz
    assert max(g["results"][0]["err"].values()) < 1e-5


def test_cli_locality_reference_mode(tmp_path):
    cmd = [sys.executable, "-m", "tcgnn_py.bench", "powerlaw:200:1500", "--device", "cpu", "--dims", "4",
           "--repeat", "1", "--inputs", "1", "--ops", "spmm,reorder", "--pattern", "locality", "--order", "locality",
           "--markdown", str(tmp_path / "b.md")]
    env = dict(os.environ, TCGNN_PY_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "vertex order: locality" in res.stdout and "locality: U/nnz 16x8 (8x4) before -> after" in res.stdout
    assert "### Locality reorder" in (tmp_path / "b.md").read_text()


@pytest.mark.gpu
def test_bench_graph_locality_order_on_device():
    g = bench_graph("powerlaw:3001:20000", ops=("spmm",), dims=(64,), repeat=3, n_inputs=2, seed=3, order="locality")
    r = g["results"][0]
    assert {"original_cusparse_alg2", "original_cusparse_alg3"} <= set(r["us"])
    assert r["err"]["original_cusparse_alg2"] < 1e-5  # the same product, rows mapped back to the new order
    assert set(r["speedup_vs_original"]) == {"tcgnn_tf32", "tcgnn_vector_tf32", "tcgnn_fp32"}


def test_bench_geomeans_table_per_width():
    """tools/bench_geomeans.py: per-D geomeans of the harness's speedups, the count and list of points below 1.0x."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "bench_geomeans.py"
    spec = importlib.util.spec_from_file_location("bench_geomeans", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def result(D, s):
        return {"op": "spmm", "D": D, "speedup": {"ours": s}, "speedup_back_to_back": {"ours": s},
                "speedup_gpu": {"ours": 2 * s}}

    graphs = [{"graph": "a", "nnz": 10**6, "results": [result(32, 2.0), result(64, 0.5)]},
              {"graph": "b", "nnz": 10**6, "results": [result(32, 8.0), result(64, 2.0)]},
              {"graph": "small", "nnz": 10, "results": [result(32, 0.1)]}]
    lines = mod.table(graphs, "spmm", 1000, ["ours"])
    assert lines[2] == "| 32 | 4.00x | 4.00x | 8.00x |"
    assert lines[3] == "| 64 | 1.00x | 1.00x | 2.00x |"
    assert lines[4] == "| all 4 | 2.00x | 2.00x | 4.00x |"
    assert lines[5] == "| below 1.0x | 1 | 1 | 0 |"
    assert lines[6:] == ["- ours, one call from idle: a D = 64 (0.50x)", "- ours, back to back: a D = 64 (0.50x)"]


def test_results_page_from_one_run(tmp_path, monkeypatch, capsys):
    """``--page`` writes the whole page of one run: where, when, the version, the command, tables, epochs."""
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")  # main sets it for --device cpu: restored after the test
    page = tmp_path / "results.md"
    assert main(["banded:64:2", "--device", "cpu", "--dims", "4", "--repeat", "1", "--inputs", "1",
                 "--ops", "spmm,gcn", "--epochs", "1", "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Results\n") and "tcgnn_py 0.1.0" in text and "NumPy reference path" in text
    assert "python -m tcgnn_py.bench banded:64:2 --device cpu" in text and "--page" in text
    assert "### SPMM" in text and "| banded:64:2 |" in text and "## Training epochs (ms)" in text
    assert "Time to the first product" not in text  # not asked for


FAKE_BASELINES = """
def builders():
    def build(problem, model):
        if model != "gcn":
            return None  # this framework has no such model
        return (lambda: None), (lambda: None)
    return {"otherlib": build}, {"otherlib": "9.9"}
"""


def test_baselines_file_adds_columns_to_the_epoch_table(tmp_path, monkeypatch):
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    (tmp_path / "other.py").write_text(FAKE_BASELINES)
    page = tmp_path / "results.md"
    assert main(["banded:64:2", "--device", "cpu", "--ops", "gcn,agnn", "--epochs", "1",
                 "--baselines", str(tmp_path / "other.py"), "--page", str(page)]) == 0
    text = page.read_text()
    assert "otherlib 9.9" in text and "otherlib" in text.split("## Training epochs (ms)")[1]


FAKE_SAMPLE_BASELINES = FAKE_BASELINES + """
import os


def sample_builders():
    def build(problem, hidden):
        def train(seeds, blocks):
            with open(os.environ["TCGNN_PY_TEST_SEEN"], "a") as f:
                kinds = ",".join(type(b.adj).__name__ for b in blocks)
                f.write(f"{len(seeds)} {kinds} {blocks[-1].dst.tolist() == list(seeds)}\\n")
        return train
    return {"otherlib": build, "absent": lambda problem, hidden: None}
"""


def test_baselines_file_trains_its_layers_on_the_samplers_blocks(tmp_path, monkeypatch, capsys):
    """``sample_builders()`` adds a column to the sampled table: its ``train`` gets each batch's seeds and the
    sampler's CSR blocks, with the sampling and without it; a build that returns None adds none."""
    from tcgnn_py.bench import _sample
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    monkeypatch.setenv("TCGNN_PY_TEST_SEEN", str(tmp_path / "seen.txt"))
    (tmp_path / "other.py").write_text(FAKE_SAMPLE_BASELINES)
    assert main(["banded:300:3", "--device", "cpu", "--ops", "sample", "--repeat", "1",
                 "--baselines", str(tmp_path / "other.py")]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| graph | nnz | sampled"))
    assert "epoch ms otherlib (trained only)" in header and "× otherlib (× trained only)" in header
    assert "absent" not in header
    row = next(line for line in out.splitlines() if line.startswith("| banded:300:3 |"))
    assert len(row.split("|")) == len(header.split("|"))
    seen = (tmp_path / "seen.txt").read_text().splitlines()
    # a first step, an epoch's warm-up steps, then STEPS with the sampling and STEPS on batches sampled before
    assert len(seen) == 1 + 3 * _sample.STEPS
    kinds = "csr_array," * (len(_sample.FANOUTS) - 1) + "csr_array"
    assert all(line.split()[1:] == [kinds, "True"] and int(line.split()[0]) > 0 for line in seen)



def test_sampled_table_counts_the_sampling_on_this_librarys_side():
    """Each speedup has this library's epoch with the sampling below: theirs with it, and (in brackets) theirs trained
    only on the same batches sampled beforehand."""
    from tcgnn_py.bench._sample import sample_markdown

    rows = [{"graph": "g", "kind": "sampler", "nnz": 10, "entries_per_s": 2e6, "ms": 1.0},
            {"graph": "g", "kind": "epoch", "impl": "tcgnn_py", "ms": 200.0, "ms_trained": 100.0},
            {"graph": "g", "kind": "epoch", "impl": "other", "ms": 100.0, "ms_trained": 50.0}]
    row = sample_markdown(rows).splitlines()[-1]
    assert row.endswith("| 200.0 (100.0) | 100.0 (50.0) | 0.50× (0.25×) |")

FAKE_CLASSIFY_BASELINES = FAKE_BASELINES + """
import os


def classify_builders():
    def build(problem, hidden, layers):
        def step(ids, learn):
            with open(os.environ["TCGNN_PY_TEST_SEEN"], "a") as f:
                f.write(f"{len(ids)} {learn} {hidden} {layers}\\n")
            return 0.0, len(ids) if not learn else 0
        return step
    return {"otherlib": build}
"""


def test_graph_classification_table_and_its_csr_normalisation(tmp_path, monkeypatch, capsys):
    """``--ops classify`` on a folder of small graphs: this library's column, the CSR pipeline's (whose
    normalisation is gcn_norm's), and the baselines file's ``classify_builders()`` on the same batches of graph
    ids, every epoch's and then the test set's; the results page has the section."""
    from tcgnn_py import nn
    from tcgnn_py.bench import _classify
    from tcgnn_py.bench.__main__ import main

    A = sp.csr_array(sp.random_array((30, 30), density=0.2, rng=np.random.default_rng(1)) > 0, dtype=np.float32)
    np.testing.assert_allclose(_classify._csr_norm(A, np).toarray(), nn.gcn_norm(A, device="cpu").toarray(),
                               rtol=1e-6, atol=1e-7)
    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    monkeypatch.setenv("TCGNN_PY_TEST_SEEN", str(tmp_path / "seen.txt"))
    folder = _graph_set(tmp_path / "graphs")
    (tmp_path / "other.py").write_text(FAKE_CLASSIFY_BASELINES)
    page = tmp_path / "page.md"
    assert main([str(folder), "--device", "cpu", "--ops", "classify", "--epochs", "2",
                 "--baselines", str(tmp_path / "other.py"), "--page", str(page)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| graphs | count |"))
    assert header.count("epoch ms") == 4 and "× scipy" in header and "× otherlib" in header
    assert "× tcgnn_py tiled" in header
    row = next(line for line in out.splitlines() if line.startswith("| graphs | 40 |"))
    assert "(100.0 ± 0.0 %)" in row.split("|")[6]  # (the fake counts every test graph right, with every seed)
    seen = [line.split() for line in (tmp_path / "seen.txt").read_text().splitlines()]
    n_train, seeds = int(0.8 * 40), _classify.SEEDS
    # one batch of every training graph: an untimed epoch, then two per seed; the test set once per seed
    assert [int(s[0]) for s in seen if s[1] == "True"] == [n_train] * (1 + 2 * seeds)
    assert [int(s[0]) for s in seen if s[1] == "False"] == [40 - n_train] * seeds
    assert all(s[2:] == [str(_classify.HIDDEN), str(_classify.LAYERS)] for s in seen)
    assert "## Graph classification" in page.read_text()


def test_baselines_file_that_is_missing_is_an_argument_error(tmp_path, monkeypatch, capsys):
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    with pytest.raises(SystemExit) as e:
        main(["banded:64:2", "--device", "cpu", "--ops", "gcn", "--baselines", str(tmp_path / "none.py")])
    assert e.value.code == 2 and "--baselines" in capsys.readouterr().err


def test_first_product_needs_a_gpu(monkeypatch, capsys):
    from tcgnn_py.bench.__main__ import main

    if GPU:
        pytest.skip("checks the message given where no GPU is usable")
    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    with pytest.raises(SystemExit) as e:
        main(["cora", "--device", "cpu", "--first-product", "1"])
    assert e.value.code == 2 and "--first-product" in capsys.readouterr().err


def test_first_product_table_has_the_graph_rows_when_a_graph_was_timed():
    from tcgnn_py.bench._first import ROWS, first_product_markdown

    steps = {k: 0.5 for _, key in ROWS for k in (key if isinstance(key, tuple) else (key,)) if k and k[:2] != "g_"}
    runs = [{"cold": dict(steps), "warm": dict(steps)}]
    assert "the graph" not in first_product_markdown(runs)
    for kind in ("cold", "warm"):
        runs[0][kind].update(g_import=0.25, g_tiled=0.125, g_f32=0.25, g_wall=1.0, g_nnz=342004)
    table = first_product_markdown(runs)
    assert "| the graph (342,004 entries): import tcgnn_py | 0.25 s | 0.25 s |" in table
    assert "| the graph: TiledMatrix + first product (after the import) | 0.38 s (0.12 + 0.25) |" in table


def test_bench_attention_reference_mode():
    """The attention op on the host: every case, both passes, the reference beside the unfused sequence, and a
    table line per case."""
    from tcgnn_py.bench._attention import ATTENTION_CASES, attention_markdown, bench_attention

    rows = bench_attention("powerlaw:60:300", calls=1, device="cpu")
    assert {(r["score"], r["heads"]) for r in rows} == set(ATTENTION_CASES)
    assert {r["impl"] for r in rows} == {"reference", "unfused"}
    assert all(r["b2b_us"] > 0 and r["gpu_us"] is None for r in rows)
    table = attention_markdown(rows).splitlines()
    assert len(table) == 2 + len(ATTENTION_CASES) * 2 * 2  # cases x (attention, layer) x (fwd, fwd+bwd)
    assert "GAT 4 heads layer" in table[-1]


@pytest.mark.gpu
def test_bench_attention_on_device():
    """On the GPU the fused pass is timed (float32 throughout, so the kernels run, not the reference) on both
    clocks."""
    from tcgnn_py.bench._attention import bench_attention

    rows = bench_attention("powerlaw:300:3000", calls=2, device="cuda")
    assert {r["impl"] for r in rows} == {"fused", "unfused"}
    assert all(r["b2b_us"] > 0 and r["gpu_us"] > 0 for r in rows)


def test_one_command_writes_every_results_page(tmp_path, monkeypatch):
    """``--page`` with ``--attention-page``: one run, two pages naming the same command and commit; the epoch table
    on the first page only, the attention tables on the second, each linking to the other."""
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    page, att = tmp_path / "results.md", tmp_path / "attention.md"
    assert main(["powerlaw:60:300", "--device", "cpu", "--dims", "4", "--repeat", "1", "--inputs", "1",
                 "--ops", "spmm,gcn,attention", "--epochs", "1", "--page", str(page),
                 "--attention-page", str(att)]) == 0
    main_text, att_text = page.read_text(), att.read_text()
    head = [t.split("Regenerate it with:")[0] for t in (main_text, att_text)]
    assert head[0].split("\n", 1)[1] == head[1].split("\n", 1)[1]  # same run: machine, date, version, commit
    cmd = [t.split("```bash\n")[1].split("\n")[0] for t in (main_text, att_text)]
    assert cmd[0] == cmd[1] and "--attention-page" in cmd[0]
    assert "## Training epochs (ms)" in main_text and "## Training epochs (ms)" not in att_text
    assert "## Graph attention" in att_text and "## Graph attention" not in main_text
    assert "](attention.md)" in main_text and "](results.md)" in att_text


def test_attention_page_needs_the_attention_op(tmp_path, monkeypatch, capsys):
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    with pytest.raises(SystemExit) as e:
        main(["cora", "--device", "cpu", "--ops", "gcn", "--page", str(tmp_path / "a.md"),
              "--attention-page", str(tmp_path / "b.md")])
    assert e.value.code == 2 and "--attention-page" in capsys.readouterr().err


def test_cache_nbytes_counts_each_cached_array_once_and_nothing_else():
    """What the products cache: arrays, containers of them, and types (a kernel's array type), which have an
    ``nbytes`` descriptor, not a size."""
    T = TiledMatrix(sp.csr_array(np.eye(5, dtype=np.float32)), device="cpu")
    t = T.tiling
    T @ np.ones((5, 3), np.float32)
    T.T
    base = t.cache_nbytes()
    a = np.zeros(10, np.float32)
    t.put(("test", 1), a)
    t.put(("test", 2), (a, [a, {"k": np.ones(3)}]))
    t.put(("test", 3), np.ndarray)
    t.put(("test", 4), (np.float32, np.dtype(np.float32), "text", 7, None))
    if GPU:
        import cupy

        t.put(("test", 5), (cupy.ndarray, cupy.zeros(4, cupy.float64)))
    assert t.cache_nbytes() == base + 40 + 24 + (32 if GPU else 0)


_CLI_OPS = ("spmm", "sddmm", "sgt", "reorder", "gcn", "agnn", "gat", "attention", "jax", "sample", "classify")


def _graph_set(folder, n_graphs=40, seed=0):
    """A folder of small graphs as ``proteins_full`` holds them: one block-diagonal ``adj_csr.npz``, node labels,
    ``graph_indicator.npy`` and ``graph_labels.npy`` (1 and 2, as the set's)."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(n_graphs):
        n = int(rng.integers(1, 12))
        g = sp.random_array((n, n), density=0.3, rng=rng, format="csr")
        graphs.append(((g + g.T) > 0).astype(np.float32))
    folder.mkdir()
    sp.save_npz(folder / "adj_csr.npz", sp.csr_array(sp.block_diag(graphs, format="csr")))
    sizes = [g.shape[0] for g in graphs]
    np.save(folder / "labels.npy", rng.integers(0, 3, sum(sizes)))
    np.save(folder / "graph_indicator.npy", np.repeat(np.arange(n_graphs), sizes))
    np.save(folder / "graph_labels.npy", rng.integers(1, 3, n_graphs))
    return folder


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("op", _CLI_OPS)
def test_cli_runs_every_op(op, device, tmp_path, monkeypatch):
    """Each --ops value alone, through the whole command (tables, JSON, page), on the host and on the GPU."""
    from tcgnn_py.bench.__main__ import _OPS, main

    assert set(_CLI_OPS) == set(_OPS)
    if op == "jax":
        pytest.importorskip("jax", reason="--ops jax needs JAX")
    if device == "cpu":
        monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    graph = "cora" if device == "cuda" else "powerlaw:60:300"
    if op == "classify":
        graph = str(_graph_set(tmp_path / "graphs"))
    args = [graph, "--device", device, "--ops", op, "--repeat", "1", "--inputs", "1", "--epochs", "1",
            "--json", str(tmp_path / "r.json"), "--page", str(tmp_path / "page.md")]
    if op in ("spmm", "sddmm"):
        args += ["--dims", "8"]
    assert main(args) == 0
    assert json.loads((tmp_path / "r.json").read_text())["env"]["tcgnn_py"]
    assert (tmp_path / "page.md").read_text().startswith("# Results")


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gcn", "agnn", "gat"])
def test_the_pure_jax_models_are_the_harness_models(model):
    """The harness's JAX column trains the same model: with the same parameters and no dropout its logits are
    tcgnn_py.nn's (float32 products on both sides), and its jitted step lowers the training loss."""
    from tcgnn_py.bench import _jax_models

    if not _jax_models.available():
        pytest.skip("the pure-JAX baselines need JAX and optax (the GPU image has both)")
    import cupy as cp
    import jax
    import jax.numpy as jnp

    from tcgnn_py import nn
    from tcgnn_py.bench import gnn_problem

    problem = gnn_problem("cora")
    dims = (problem["X"].shape[1], 8 if model == "gat" else 16, problem["n_classes"])
    params = _jax_models.init(model, dims, seed=1)
    A = (nn.gcn_norm if model == "gcn" else nn.add_self_loops)(problem["adj"], device="cuda")
    apply = {"gcn": nn.gcn_apply, "agnn": nn.agnn_apply, "gat": nn.gat_apply}[model]
    ours, _ = apply({k: cp.asarray(v) for k, v in params.items()}, A, cp.asarray(problem["X"]), training=False,
                    precision="fp32")
    rows, cols, weights, n = _jax_models.graph_arrays(problem["adj"], model)
    graph = (jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(weights), n)
    with jax.default_matmul_precision("highest"):
        theirs = _jax_models.forward(model, {k: jnp.asarray(v) for k, v in params.items()}, graph,
                                     jnp.asarray(problem["X"]))
    np.testing.assert_allclose(np.asarray(theirs), ours.get(), rtol=1e-4, atol=2e-5)

    step, sync = _jax_models.build(problem, model)
    before = step.loss()
    for _ in range(60):
        step()
    sync()
    assert step.loss() < 0.8 * before


def test_the_jax_models_step_donates_its_carry():
    """The harness's jitted JAX step donates its parameters, optimizer state and key, as a JAX training step is
    written for speed: the buffers it was given are the results' (JAX's CPU backend donates too)."""
    import inspect

    from tcgnn_py.bench import _jax_models, gnn_problem

    if not _jax_models.available():
        pytest.skip("the pure-JAX models need JAX and optax (the test extra installs both)")
    import jax

    step, sync = _jax_models.build(gnn_problem("cora"), "gcn")
    carry = inspect.getclosurevars(step).nonlocals["carry"]
    step()
    given = jax.tree_util.tree_leaves(carry)
    step()
    sync()
    assert given and all(a.is_deleted() for a in given)
    assert all(not a.is_deleted() for a in jax.tree_util.tree_leaves(carry))


@pytest.mark.parametrize("model", ["gcn", "agnn", "gat"])
def test_the_jax_models_aggregate_alike_by_segment_sum_bcoo_and_this_library(model):
    """The JAX models' three aggregations (the epoch table's JAX columns) give the same logits, on JAX's CPU
    backend (this library's products through tcgnn_py.jax's host implementation, the graph in its matrix's stored
    order; for AGNN and GAT also its fused attention, as the jax_tcgnn column trains them)."""
    jax = pytest.importorskip("jax", reason="the JAX models need JAX")
    import jax.numpy as jnp

    from tcgnn_py import nn
    from tcgnn_py.bench import _jax_models, gnn_problem

    problem = gnn_problem("cora")
    dims = (problem["X"].shape[1], 8 if model == "gat" else 16, problem["n_classes"])
    params = {k: jnp.asarray(v) for k, v in _jax_models.init(model, dims, seed=1).items()}
    T = (nn.gcn_norm if model == "gcn" else nn.add_self_loops)(problem["adj"], device="cpu")
    X = jnp.asarray(problem["X"])
    with jax.default_matmul_precision("highest"):
        graph, *_ = _jax_models.aggregations(problem["adj"], model, "segment_sum")
        want = _jax_models.forward(model, params, graph, X)
        for aggregation in ("bcoo", "tcgnn"):
            graph, product, cosines, attend, _, gcn = _jax_models.aggregations(problem["adj"], model, aggregation, T)
            # (the library's products, or its fused attention or GCN layer)
            for fused, conv in ((None, None), (attend, gcn)) if aggregation == "tcgnn" else ((None, None),):
                got = _jax_models.forward(model, params, graph, X, product=product, cosines=cosines,
                                          rows_sorted=aggregation != "tcgnn", attend=fused, gcn=conv)
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=2e-5)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        _jax_models.build(problem, model, aggregation="scatter")


def test_the_jax_op_times_the_jitted_aggregations(tmp_path, monkeypatch):
    """``--ops jax``: per graph, the jitted aggregation by tcgnn_py.jax, segment_sum and BCOO, in a chain and in
    one call (on the host: JAX's CPU backend, the reference product; no GPU-only column)."""
    pytest.importorskip("jax", reason="--ops jax needs JAX")
    from tcgnn_py.bench.__main__ import main

    # main sets it for --device cpu: restored after the test (else the worker's later GPU tests' subprocesses would
    # inherit it and run on the host)
    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")

    out = tmp_path / "r.json"
    assert main(["cora", "--ops", "jax", "--device", "cpu", "--repeat", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["jax"]
    assert [(r["kind"], r["impl"]) for r in rows] == [("aggregate", "tcgnn_py.jax"), ("aggregate", "segment_sum"),
                                                      ("aggregate", "BCOO")]
    assert all(r["us"] > 0 and r["call_us"] > 0 and r["graph"] == "cora" and "gpu_us" not in r for r in rows)
    # XLA's temporaries of one call: none for the library's, whose call reads x and writes XLA's result buffer
    temps = {r["impl"]: r["temp_bytes"] for r in rows}
    assert all(isinstance(t, int) and t >= 0 for t in temps.values()) and "allocations" not in rows[0]
    assert temps["tcgnn_py.jax"] == 0
    import scipy.sparse as sp

    sp.save_npz(tmp_path / "wide.npz", sp.random(30, 20, density=0.2, format="csr", random_state=0))
    with pytest.raises(ValueError, match="must be square"):
        main([str(tmp_path / "wide.npz"), "--ops", "jax", "--device", "cpu", "--repeat", "2"])


@pytest.mark.parametrize("ops, with_jax", [("gcn", False), ("gcn,jax", True)])
def test_the_epoch_tables_jax_columns_come_with_ops_jax(ops, with_jax, tmp_path, monkeypatch):
    """The harness asks the epoch table for its JAX columns only with ``--ops jax`` (XLA's compile of each model's
    step would otherwise lengthen every run of the epoch table, the results page's among them)."""
    pytest.importorskip("jax", reason="--ops jax needs JAX")
    from tcgnn_py.bench import __main__ as cli, _gnn

    asked = []
    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    monkeypatch.setattr(_gnn, "bench_gnn", lambda *a, with_jax=True, **k: asked.append(with_jax) or [])
    assert cli.main(["powerlaw:60:300", "--device", "cpu", "--ops", ops, "--repeat", "1", "--epochs", "1"]) == 0
    assert asked == [with_jax]


def test_the_epoch_tables_jax_columns_are_chosen_by_aggregation():
    """``with_jax`` takes the JAX columns by aggregation (the pure-JAX model alone compiles in a fraction of the
    three's time), in the table's order; an unknown one names itself before any graph is loaded."""
    from tcgnn_py.bench import JAX_COLUMNS, _gnn, bench_gnn

    assert _gnn._jax_aggregations(True) == tuple(JAX_COLUMNS) and _gnn._jax_aggregations(False) == ()
    assert _gnn._jax_aggregations(["tcgnn", "segment_sum"]) == ("segment_sum", "tcgnn")
    with pytest.raises(ValueError, match=r"with_jax: unknown aggregation 'csr' \(one of segment_sum, bcoo, tcgnn\)"):
        bench_gnn("no-such-graph", device="cpu", with_jax=["csr"])
    with pytest.raises(TypeError, match="with_jax must be a bool or a sequence of aggregations, got str"):
        bench_gnn("no-such-graph", device="cpu", with_jax="segment_sum")


@pytest.mark.parametrize("flag, want", [([], ["segment_sum", "bcoo", "tcgnn"]),
                                        (["--jax", "segment_sum"], ["segment_sum"]), (["--jax", "none"], [])])
def test_the_epoch_table_tool_passes_its_jax_columns(flag, want, monkeypatch):
    """``tools/gnn_epoch_table.py --jax`` reaches the epoch table as its columns' aggregations."""
    import runpy
    import tcgnn_py.bench as bench

    asked = []
    monkeypatch.setattr(bench, "bench_gnn", lambda spec, with_jax=True, **k: asked.append(list(with_jax)) or [])
    monkeypatch.setattr(sys, "argv", ["gnn_epoch_table.py", "cora"] + flag)
    runpy.run_path(str(pathlib.Path(__file__).resolve().parents[1] / "tools" / "gnn_epoch_table.py"),
                   run_name="__main__")
    assert asked == [want]


def test_epoch_and_attention_tables_print_per_graph_as_measured(monkeypatch, capsys):
    """Each graph's epoch and attention tables are printed once that graph is measured, before the next graph
    runs: a run cut short by a time limit keeps what it printed."""
    from tcgnn_py.bench import _attention
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")
    monkeypatch.setattr(_attention, "ATTENTION_CASES", (("cosine", 1),))
    assert main(["banded:64:2", "banded:48:2", "--device", "cpu", "--ops", "gcn,attention", "--epochs", "1",
                 "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    epochs, attention = out.split("ms per training epoch")[1:], out.split("us per attention call")[1:]
    assert len(epochs) == 2 and len(attention) == 2
    # the first graph's tables come before anything of the second
    first, second = out.split("banded:48:2", 1)
    assert "ms per training epoch" in first and "us per attention call" in first
    assert "| banded:64:2 |" not in second
