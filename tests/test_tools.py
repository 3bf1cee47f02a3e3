"""Every script under tools/ runs: its ``--help`` where it has one (imports and arguments, no GPU needed), and
``tools/dist_bench.py`` end to end on host ranks under ``mpiexec`` (the reference backend, a tiny graph)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

#: Open MPI refuses to start as root (the GPU machine's user) without both variables; MPICH ignores them.
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLS = sorted(p for p in (ROOT / "tools").glob("*.py") if not p.name.startswith("_"))
#: Tools that import CuPy when they start (GPU-only: their --help runs on the GPU machine).
NEEDS_CUPY = {"memcheck_nn.py", "memcheck_products.py", "nm_bench.py", "profile_gnn.py"}


def _env():
    env = dict(os.environ, TCGNN_PY_DEVICE="cpu", PYTHONUNBUFFERED="1", **AS_ROOT)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + str(ROOT / "tools") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_every_tool_compiles():
    for p in TOOLS + [ROOT / "tools" / "_sweep.py"]:
        compile(p.read_text(), str(p), "exec")
    assert len(TOOLS) >= 10


def _has_cupy():
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("tool", [p for p in TOOLS if "argparse" in p.read_text()], ids=lambda p: p.name)
def test_tool_help(tool):
    if tool.name in NEEDS_CUPY and not _has_cupy():
        pytest.skip(f"{tool.name} imports CuPy when it starts (a GPU tool)")
    r = subprocess.run([sys.executable, str(tool), "--help"], capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "usage:" in r.stdout


def test_memcheck_jax_runs_on_jaxs_cpu_backend():
    """tools/memcheck_jax.py's workload whole on JAX's CPU backend (the reference path): its exact comparisons
    and its jitted training steps, as compute-sanitizer runs it on the GPU."""
    pytest.importorskip("jax", reason="tcgnn_py.jax needs JAX")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "memcheck_jax.py"), "--n", "300", "--steps", "3"],
                       capture_output=True, text=True, timeout=300, env=dict(_env(), JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stdout + r.stderr
    for part in ("products, sddmm, vmap exact", "dropped products and their gradients exact",
                 "fused attention forward and backward", "3 jitted training steps"):
        assert part in r.stdout, r.stdout


MPIEXEC = shutil.which("mpiexec") or shutil.which("mpirun")


@pytest.mark.skipif(MPIEXEC is None, reason="needs an MPI launcher (pip install 'tcgnn_py[test]' brings MPICH's)")
def test_dist_bench_runs_on_host_ranks(tmp_path):
    pytest.importorskip("mpi4py", reason="needs mpi4py")
    page, js = tmp_path / "multi-gpu.md", tmp_path / "r.json"
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "tools" / "dist_bench.py"),
                        "--backend", "reference", "--graph", "planted:1500:12000:4", "--weak", "800:6000:4",
                        "--gpus", "1", "2", "--partition", "none", "--gcn", "8,4", "--epochs", "2", "--reps", "1",
                        "--halo-dtype", "float32", "float16", "--json", str(js), "--page", str(page)],
                       capture_output=True, text=True, timeout=600, env=_env(), start_new_session=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = page.read_text()
    for section in ("## SpMM", "## GCN training epoch", "## Weak scaling", "## Memory per stored entry"):
        assert section in text
    assert "| planted:1500:12000:4 | float16 | 2 |" in text and "one GPU, plain" in text


def test_against_summary_is_the_speed_of_one_launch_against_another():
    # (timed_choice.py's comparison of the statistics' launch with the timed choice's, on made-up clocks)
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from _sweep import against_summary
    finally:
        sys.path.remove(str(ROOT / "tools"))
    rows = [{"statistics": {"gpu": 10.0}, "timed": {"gpu": 8.0}}, {"statistics": {"gpu": 5.0}, "timed": {"gpu": 5.0}}]
    (line,) = against_summary(rows, "statistics", "timed", clocks=(("gpu", "GPU-only"),))
    assert line == "GPU-only, statistics against timed: geomean 0.894x, 1 of 2 within 5 %, worst 0.80x"


def test_rule_fit_reads_the_timed_choices_records(tmp_path):
    # (tools/rule_fit.py on records in timed_choice.py's format: a point where the timed choice kept another launch,
    # one where it kept the statistics', and the statistics' configuration with a field replaced)
    def key(U, DV=False):
        return str(("SpmmVecAsync", 1, U, 2, True, True, True, DV, False, False, 16))

    rows = [{"graph": "g", "D": 64, "timed": {"won": ["SpmmVecAsync", 1, 2, True, False, False],
                                              "candidates_us": {key(4): 10.0, key(2): 8.0, key(4, True): 9.0}}},
            {"graph": "h", "D": 32, "timed": {"won": ["SpmmVecAsync", 1, 4, True, False, False],
                                              "candidates_us": {key(4): 5.0, key(2): 5.1}}}]
    path = tmp_path / "timed.json"
    path.write_text(__import__("json").dumps({"rows": rows}))
    tool = [sys.executable, str(ROOT / "tools" / "rule_fit.py"), str(path)]
    r = subprocess.run(tool, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("statistics against timed (the timed choice's clock): geomean 0.894x, 1 of 2 within 5 %, worst 0.80x"
            " (g D=64)") in r.stdout
    r = subprocess.run(tool + ["--set", "U=2"], capture_output=True, text=True, timeout=120, env=_env())
    assert ("statistics, U=2 against timed (the timed choice's clock): geomean 0.990x, 2 of 2 within 5 %, worst 0.98x"
            " (h D=32)") in r.stdout  # (8 against 8 on g; 5.0 against 5.1 on h)
    r = subprocess.run(tool + ["--set", "U"], capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 2 and "--set takes FIELD=VALUE" in r.stderr
