"""Benchmark harness: ``python -m tcgnn_py.bench GRAPH ... [--ops ...] [--dims ...]`` (layer 4).

The text below is the command's ``--help``.
"""

HELP = """\
Time tcgnn_py's products, translation and reorders against cuSPARSE, cupyx and SciPy.

Graphs are names of folders holding adj_csr.npz under $TCGNN_PY_DATA (only cora
ships with the package), paths to a graph folder, .npz or .mtx, or synthetic
powerlaw:N:NNZ, uniform:N:NNZ, banded:N:HALF_WIDTH.

For each graph and width every product is checked against a baseline, then timed
(CUDA-event medians after warm-up, fresh random inputs rotated between calls) on
three clocks: one call from idle (the host's issue time inside), calls back to
back, and GPU-only (calls queued behind a spin kernel, the host's time outside):

* SpMM: tcgnn_py TF32 and fp32 beside cuSPARSE CSR ALG2 and ALG3 with a
  row-major X (the faster is "best"), and cupyx A @ X;
* SDDMM: tcgnn_py TF32 and fp32 beside cuSPARSE SDDMM and a CuPy
  gather-and-dot kernel;
* the translation (SGT) and the ready-to-multiply build, the calls that repay it,
  the tiled format's memory against CSR, and how many columns the row windows
  share (U / nnz and tile density per layout); with the reorder op, the reorder
  of --pattern (an N:M pattern, or locality);
* with --order locality|rcm|degree: the products on the renumbered graph, beside
  cuSPARSE on the graph in its original order;
* with gcn / agnn / gat: milliseconds per training epoch of the models in
  tcgnn_py.nn, beside the same models on cupyx sparse ops;
* with attention: one graph-attention layer (GAT with 1 and 4 heads, AGNN),
  forward and forward + backward, fused against the library's unfused
  sequence and against the --baselines file's layers;
* with sample: the neighbor sampler's sampled entries per second, and a
  sampled GraphSAGE epoch on tiled blocks beside cupyx's (scipy's) products
  and the --baselines file's layers on the same blocks, each with the
  sampling and without it;
* with classify (a folder of small graphs, such as proteins_full): a graph
  classification epoch on batches joined into one matrix every step, with
  its test accuracy, beside the same layers on cupyx's (scipy's) products
  and the --baselines file's models;
* with jax (JAX installed): the jitted aggregation A @ X (D = 64) by
  tcgnn_py.jax against jax.ops.segment_sum and a BCOO product, per
  aggregation of a jitted chain and in one call, and the chain's time per
  product against the product's GPU-only time (the host cost inside XLA);
  with gcn, agnn or gat too, the epoch table's JAX columns: the same models
  jitted in JAX with segment_sum, BCOO and tcgnn_py.jax aggregations.

Bandwidths are given under two traffic bounds (per-edge gather and window reuse)
as GB/s and as a share of the measured copy bandwidth. --device cpu runs the
NumPy reference path against SciPy with the host clock.
"""

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys

from ._report import markdown, plot_speedups, print_graph, print_reorder, summary
from ._run import DEFAULT_DIMS, ORDERS

_OPS = ("spmm", "sddmm", "sgt", "reorder", "gcn", "agnn", "gat", "attention", "jax", "sample", "classify")


def _ints(text):
    try:
        dims = tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"feature widths must be integers >= 1, got {text!r}")
    return dims


def _dtypes(text):
    dts = tuple(v for v in text.split(",") if v)
    bad = set(dts) - {"float32", "float16", "bfloat16"}
    if bad or not dts:
        raise argparse.ArgumentTypeError(f"unknown dtypes {sorted(bad)}; choose from float32, float16, bfloat16")
    return dts


def _ops(text):
    ops = tuple(v for v in text.split(",") if v)
    bad = set(ops) - set(_OPS)
    if bad:
        raise argparse.ArgumentTypeError(f"unknown ops {sorted(bad)}; choose from {', '.join(_OPS)}")
    return ops


def environment(gpu, argv=None):
    """Date, machine, versions and commit of a run."""
    import numpy
    import scipy

    from .. import __version__

    env = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "python": platform.python_version(), "numpy": numpy.__version__, "scipy": scipy.__version__,
           "tcgnn_py": __version__, "command": "python -m tcgnn_py.bench " + " ".join(sys.argv[1:] if argv is None else argv)}
    try:
        here = pathlib.Path(__file__).parent
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=here,  # noqa: E731
                                        check=True).stdout.strip()
        # a tree that differs from its commit is not that commit: say so rather than name it
        env["commit"] = git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain",
                                                                                 "--untracked-files=no", ":/") else "")
    except Exception:
        env["commit"] = None
    if gpu:
        import cupy
        import numba_cuda

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        env.update(gpu=props["name"].decode(), driver=cupy.cuda.runtime.driverGetVersion(),
                   cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(), cupy=cupy.__version__,
                   numba_cuda=numba_cuda.__version__)
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tcgnn_py.bench", description=HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="+", metavar="GRAPH")
    ap.add_argument("--ops", type=_ops, default=("spmm", "sddmm"),
                    help="comma-separated from spmm, sddmm, sgt, reorder, gcn, agnn, gat, attention, jax, sample, "
                         "classify "
                         "(default spmm,sddmm; preprocessing is measured unless only models are asked for)")
    ap.add_argument("--dims", type=_ints, default=None,
                    help="feature widths of the spmm and sddmm ops (default 32,64,128,256; the attention op times 64 "
                         "features per head, the models their own widths)")
    ap.add_argument("--dtypes", type=_dtypes, default=("float32",),
                    help="SpMM feature dtypes, comma-separated from float32, float16, bfloat16 (default float32): "
                         "16-bit ones run the vector layout's 16-bit kernel beside cuSPARSE fp32 and 16-bit")
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per median (default 20)")
    ap.add_argument("--inputs", type=int, default=4, help="fresh random inputs rotated between calls")
    ap.add_argument("--epochs", type=int, default=20,
                    help="training epochs per timed batch (gcn, agnn, gat), and of each classify run")
    ap.add_argument("--pattern", default="2:4", help="N:M or V:N:M pattern of the reorder, or 'locality'")
    ap.add_argument("--order", choices=ORDERS, default=None,
                    help="renumber each graph's vertices first and measure the renumbered graph")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="cpu: the NumPy reference path against SciPy (default: cuda when usable)")
    ap.add_argument("--json", metavar="FILE", help="write every measurement and the environment here")
    ap.add_argument("--markdown", metavar="FILE", help="write the results page's tables here (Markdown)")
    ap.add_argument("--summary-min-nnz", type=int, default=0, metavar="N",
                    help="geomean speedup lines over the graphs with at least N stored entries (default all)")
    ap.add_argument("--plot", metavar="PNG", help="draw speedup bars per graph (needs matplotlib)")
    ap.add_argument("--page", metavar="FILE",
                    help="write the whole results page (Markdown): the run's card, date, version and command, the "
                         "geomeans, every table, the plot and, with --first-product, the time to the first product")
    ap.add_argument("--attention-page", metavar="FILE",
                    help="with --page and --ops attention: the attention tables go to this page of the same run "
                         "(one command writes every results page; the epoch table stays on --page)")
    ap.add_argument("--baselines", metavar="FILE.py",
                    help="gcn, agnn, gat, attention: a file (kept outside this package) whose builders() adds other "
                         "frameworks' models to the epoch table, e.g. PyTorch Geometric's, and whose "
                         "attention_builders() (optional) adds their attention layers")
    ap.add_argument("--first-product", type=int, default=None, metavar="RUNS",
                    help="also time the first product in RUNS >= 1 fresh processes, empty and warm caches (GPU only)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TCGNN_PY_DEVICE"] = "cpu"  # before anything probes the GPU
    from .._device import gpu_available
    from ._attention import attention_markdown, bench_attention
    from ._gnn import bench_gnn, gnn_markdown, load_baselines
    from ._run import bench_graph, bench_reorder
    from ._timing import copy_bandwidth

    gpu = args.device != "cpu" and gpu_available()  # --device cpu: the host path even where a GPU is usable
    if args.device == "cuda" and not gpu:
        ap.error("--device cuda: no usable GPU here")
    if args.repeat < 1 or args.inputs < 1 or args.epochs < 1:
        ap.error("--repeat, --inputs and --epochs must be at least 1")
    if args.summary_min_nnz < 0:
        ap.error("--summary-min-nnz must be >= 0")
    if args.first_product is not None and args.first_product < 1:
        ap.error(f"--first-product takes a number of runs >= 1, got {args.first_product}")
    products = tuple(op for op in args.ops if op in ("spmm", "sddmm"))
    if args.dims is not None and not products:
        ap.error(f"--dims sets the widths of the spmm and sddmm ops, and --ops {','.join(args.ops)} has neither "
                 "(the attention op times 64 features per head, the models their own widths)")
    if args.dims is not None and "attention" in args.ops:
        print("--dims sets the spmm and sddmm widths; the attention op times 64 features per head")
    if args.dims is None:
        args.dims = DEFAULT_DIMS
    if "jax" in args.ops and importlib.util.find_spec("jax") is None:
        ap.error("--ops jax needs JAX (pip install 'tcgnn_py[jax]')")
    if args.attention_page is not None and (args.page is None or "attention" not in args.ops):
        ap.error("--attention-page splits the attention tables off --page: it needs --page and --ops attention")
    for flag in ("json", "markdown", "plot", "page", "attention_page"):  # an output that cannot be written fails now, not after the run
        path = getattr(args, flag)
        if path is not None and not pathlib.Path(path).resolve().parent.is_dir():
            ap.error(f"--{flag.replace('_', '-')} {path}: the folder {str(pathlib.Path(path).parent)!r} does not exist")
    if args.first_product and not gpu:
        ap.error("--first-product measures GPU kernels' compile and launch: it needs a usable GPU")
    from ._graphs import locate_graph

    for spec in args.graphs:  # a wrong name or spec is an argument error, before any measurement
        try:
            locate_graph(spec)
        except (FileNotFoundError, ValueError) as e:
            ap.error(f"graph {spec!r}: {e}")
    extra, extra_attention, extra_sample, extra_classify = {}, {}, {}, {}
    if args.baselines:
        try:
            extra, versions, extra_attention, extra_sample, extra_classify = load_baselines(args.baselines)
        except (OSError, ValueError, ImportError, AttributeError) as e:
            ap.error(f"--baselines {args.baselines}: {e}")
    env = environment(gpu, argv)
    if args.baselines:
        env["baselines"] = versions
    env["copy_bandwidth_gbps"] = copy_bandwidth(gpu) / 1e9
    where = "device-to-device" if gpu else "host memory"
    print(f"{env.get('gpu', 'host (reference path)')}; {where} copy {env['copy_bandwidth_gbps']:.0f} GB/s "
          f"(read + write); {args.repeat} timed calls per median")
    if not gpu and set(args.dtypes) - {"float32"}:
        print(f"--dtypes {','.join(d for d in args.dtypes if d != 'float32')}: not run on the host "
              "(the 16-bit products are measured on the GPU's 16-bit tensor cores only)")
    models = tuple(op for op in args.ops if op in ("gcn", "agnn", "gat"))
    graphs, reorders, gnn, attention, jaxrows, samplerows, classifyrows = [], [], [], [], [], [], []
    for spec in args.graphs:
        if set(args.ops) - set(models) - {"attention", "jax", "sample", "classify"}:  # products, sgt, reorder
            g = bench_graph(spec, products, args.dims, args.repeat, args.inputs, "cuda" if gpu else "cpu",
                            env["copy_bandwidth_gbps"] * 1e9, dtypes=args.dtypes, order=args.order)
            print_graph(g)
            graphs.append(g)
        if "reorder" in args.ops:
            reorders.append(bench_reorder(spec, args.pattern, "cuda" if gpu else "cpu"))
        # (each table per graph as it is measured)
        if models:
            rows = bench_gnn(spec, models, args.epochs, device="cuda" if gpu else "cpu", extra=extra,
                             with_jax="jax" in args.ops)
            print("\nms per training epoch\n" + gnn_markdown(rows))
            gnn += rows
        if "attention" in args.ops:
            rows = bench_attention(spec, args.repeat, "cuda" if gpu else "cpu", extra_attention)
            print("\nus per attention call\n" + attention_markdown(rows))
            attention += rows
        if "jax" in args.ops:
            from ._jax_ops import bench_jax, jax_markdown

            rows = bench_jax(spec, args.repeat, "cuda" if gpu else "cpu")
            print("\ninside jax.jit (us per call)\n" + jax_markdown(rows))
            jaxrows += rows
        if "sample" in args.ops:
            from ._sample import bench_sample, sample_markdown

            rows = bench_sample(spec, min(args.repeat, 5), "cuda" if gpu else "cpu", extra_sample)
            print(sample_markdown(rows))
            samplerows += rows
        if "classify" in args.ops:
            from ._classify import bench_classify, classify_markdown

            try:
                rows = bench_classify(spec, args.epochs, "cuda" if gpu else "cpu", extra_classify)
            except FileNotFoundError as e:
                ap.error(f"--ops classify: {e}")
            print(classify_markdown(rows))
            classifyrows += rows
        sys.stdout.flush()  # (a run cut short, or read through a pipe, keeps every graph measured)
    for line in summary(graphs, args.summary_min_nnz):
        print(line)
    if reorders:
        print_reorder(reorders)
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"env": env, "graphs": graphs, "reorder": reorders, "gnn": gnn, "attention": attention,
                        "jax": jaxrows, "sample": samplerows, "classify": classifyrows}, indent=1))
    if args.markdown:
        tables = markdown(graphs, reorders, summary_min_nnz=args.summary_min_nnz)
        pathlib.Path(args.markdown).write_text(tables + (gnn_markdown(gnn) if gnn else "")
                                               + (attention_markdown(attention) if attention else ""))
    if args.plot:
        plot_speedups(graphs, args.plot)
        print(f"plot: {args.plot}")
    first = None
    if args.first_product:
        from ._first import first_product_markdown, first_product_times

        first = first_product_markdown(first_product_times(args.first_product))
        print("\ntime to the first product\n" + first)
    if args.page:
        split = args.attention_page is not None
        pathlib.Path(args.page).write_text(results_page(env, graphs, reorders, gnn, args, first,
                                                        None if split else attention,
                                                        attention_link=args.attention_page if split else None,
                                                        jaxrows=jaxrows, samplerows=samplerows,
                                                        classifyrows=classifyrows))
        print(f"page: {args.page}")
        if split:
            pathlib.Path(args.attention_page).write_text(results_page(
                env, [], [], [], args, None, attention,
                epochs_link=os.path.relpath(args.page, pathlib.Path(args.attention_page).parent)))
            print(f"page: {args.attention_page}")
    return 0


def results_page(env, graphs, reorders, gnn, args, first=None, attention=None, attention_link=None,
                 epochs_link=None, jaxrows=None, samplerows=None, classifyrows=None):
    """The results page of one run: where and what ran, the geomeans, every table, the plot, the attention
    layers, the first product.  ``attention_link``: the page of the same run holding the attention tables;
    ``epochs_link`` (on that page): the page holding the run's other tables."""
    from ._attention import attention_markdown
    from ._gnn import gnn_markdown

    where = env.get("gpu", "the host (NumPy reference path)")
    title = "Results" if graphs or reorders else (
        ("Results: graph attention and training epochs" if gnn else "Results: graph attention") if attention
        else "Results: training epochs")
    lines = [f"# {title}", "",
             f"One run of the harness on {where}, {env['date']}: tcgnn_py {env['tcgnn_py']}"
             + (f" (commit `{env['commit']}`)" if env.get("commit") else "")
             + (f", CuPy {env['cupy']}, numba-cuda {env['numba_cuda']}" if "cupy" in env else "")
             + f", NumPy {env['numpy']}, SciPy {env['scipy']}, Python {env['python']}. Regenerate it with:", "",
             "```bash", env["command"], "```", ""]
    if env.get("baselines"):
        lines += ["Other frameworks' models come from the `--baselines` file (kept outside this package): "
                  + ", ".join(f"{k} {v}" for k, v in env["baselines"].items()) + ".", ""]
    if "gpu" in env:
        lines += ["Timings are medians of CUDA events in one process, on three clocks: one call from idle (the host's "
                  "issue time inside), calls back to back, and GPU-only (calls queued behind a spin kernel, the "
                  "host's time outside). Speedups are against the best baseline on the same card in the same "
                  "process; the geomeans follow each table.", ""]
    else:
        lines += ["Timings are host-clock medians of the NumPy reference path against SciPy (no GPU in this run).", ""]
    if attention_link:
        rel = os.path.relpath(attention_link, pathlib.Path(args.page).parent)
        lines += [f"The graph-attention tables of this run are on [their own page]({rel}).", ""]
    if epochs_link:
        lines += [f"The other tables of this run, the training epochs among them, are on [the results page]"
                  f"({epochs_link}).", ""]
    if args.plot and not epochs_link:
        lines += ["## Speedups per graph and width", "", f"![speedups]({pathlib.Path(args.plot).name})", ""]
    if graphs or reorders:
        lines += ["## Tables", markdown(graphs, reorders, summary_min_nnz=args.summary_min_nnz), ""]
    if gnn:
        lines += ["## Training epochs (ms)", "", gnn_markdown(gnn), ""]
    if attention:
        lines += ["## Graph attention (us per call)", "",
                  "One layer on the graph with self-loops, 64 features per head. `attention`: "
                  "`tcgnn_py.nn.graph_attention` alone, fused or the unfused sequence it replaces (every entry's "
                  "score, an edge softmax and SpMM per head; the backward likewise); `layer`: the whole layer, "
                  "dense products included. Cells: GPU-only (back to back).", "", attention_markdown(attention), ""]
    if jaxrows:
        from ._jax_ops import jax_markdown

        lines += ["## Inside jax.jit (us per call)", "",
                  "The aggregation `A @ X` (64 features, A row-normalised) by `tcgnn_py.jax.spmm`, "
                  "`jax.ops.segment_sum` over the edges and a `jax.experimental.sparse.BCOO` product: microseconds "
                  "per aggregation of one jitted chain of 100, and of one jitted call (host clock around the call "
                  "and `block_until_ready`: JAX's dispatch of a program included); this library's product "
                  "GPU-only, and the chain's time per product minus it: the host cost of a call inside XLA beyond "
                  "the GPU's work; the device memory one call allocates: XLA's temporaries (its compiled memory "
                  "analysis), and what CuPy allocated during this library's settled calls.", "",
                  jax_markdown(jaxrows), ""]
    if samplerows:
        from ._sample import BATCH, FANOUTS, HIDDEN, SAMPLER_BATCHES, STEPS, sample_markdown

        lines += ["## Sampled training", "",
                  f"The neighbor sampler (fan-outs {list(FANOUTS)}, batches of {BATCH} random seeds, blocks as the "
                  "training takes them: sampled entries per second and milliseconds per batch, median of "
                  f"{SAMPLER_BATCHES}), and a sampled training epoch "
                  f"({STEPS} batches of the training nodes, sampling included) of GraphSAGE ({len(FANOUTS)} mean "
                  f"layers of {HIDDEN}) on tiled blocks and this library's products, beside the same pipeline on "
                  "CSR blocks and cupyx's products (scipy's on the host) and the `--baselines` file's layers on the "
                  "same CSR blocks; in brackets, each epoch on the same number of batches sampled beforehand "
                  "(the training alone).", "", sample_markdown(samplerows), ""]
    if classifyrows:
        from ._classify import BATCH as C_BATCH, HIDDEN as C_HIDDEN, LAYERS, SEEDS, classify_markdown

        lines += ["## Graph classification", "",
                  f"Batches of {C_BATCH} small graphs joined into one block-diagonal graph and normalised every step "
                  f"(a new matrix each time); {LAYERS} GCN layers of {C_HIDDEN}, a mean readout and a linear "
                  "classifier, Adam; milliseconds per training epoch (the median, after an untimed epoch and "
                  "every background compile; the implementations' epochs in turn) and the test accuracy after "
                  f"them (80 / 20 split; the mean ± the standard deviation over {SEEDS} seeded splits and "
                  "initialisations): this library's matrices and products, the same layers on CSR (cupyx's, "
                  "scipy's on the host), and the `--baselines` file's models on the same batches.", "",
                  classify_markdown(classifyrows), ""]
    if first:
        lines += ["## Time to the first product", "", first, ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
