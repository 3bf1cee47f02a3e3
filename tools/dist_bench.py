"""Strong and weak scaling of the row-partitioned SpMM and GCN epochs on 1..P GPUs, one process per GPU under MPI.

    mpirun -n 4 python tools/dist_bench.py --graph planted:20000000:240000000:64 --gpus 1 2 4 \\
        --halo-dtype float32 float16 --gcn 128,64,16 --json FILE --page docs/multi-gpu.md

Graphs are drawn on each rank's GPU from the same seed (the same graph everywhere): ``planted:N:M:C`` is a
power-law graph with C planted communities (90 % of edges inside) and shuffled ids, ``powerlaw:N:M`` one without
communities (``tcgnn_py.planted_partition_graph`` with one group).  For each group size P of ``--gpus`` the
first P ranks form a group (an NCCL communicator of their own; the others wait), partition the graph with
``--partition`` (its time reported), build their rows and time, by CUDA events, the slowest rank's medians of:
the product ``A @ X`` (D = ``--d``), its own-columns part alone, the halo exchange alone (and the rate it
receives at), ``Aᵀ @ G``, and a GCN training epoch.  The baseline is one GPU's plain ``T @ X`` on the same
graph in the same (partitioned) order and one GPU's GCN epoch.  ``--weak N:M:C`` adds weak scaling: a planted
graph of N nodes and M edges per GPU.

``--backend reference`` runs the same program on host ranks (``mpiexec -n 2``, NumPy, host clock): CI's smoke
run of this tool.
"""

import argparse
import json
import pathlib
import sys
import time

import numpy as np


def parse_graph(spec, per_gpu=1):
    parts = spec.split(":")
    kind, n, m = parts[0], int(parts[1]) * per_gpu, int(parts[2]) * per_gpu
    if kind == "planted":
        return dict(n_nodes=n, n_edges=m, communities=int(parts[3]) if len(parts) > 3 else 64, p_in=0.9)
    if kind == "powerlaw":
        return dict(n_nodes=n, n_edges=m, communities=1, p_in=0.0)
    raise SystemExit(f"graph spec {spec!r}: planted:N:M[:C] or powerlaw:N:M")


def timer(gpu):
    from tcgnn_py.bench import time_events, time_host

    def run(fn, reps):
        return (time_events if gpu else time_host)(fn, reps, warmup=1)[0] / 1e3

    return run


def group(world, P, args):
    """The first P ranks' Context (None on the others): a group of their own over an MPI sub-communicator."""
    from tcgnn_py import distributed as dist

    color = 0 if world.rank < P else 1
    sub = world.mpi_comm.Split(color, world.rank)
    if color:
        return None, sub
    if P == world.world_size:
        return world, sub
    return dist.init(backend=args.backend, timeout=args.timeout, mpi_comm=sub), sub


def slowest(sub, value):
    return max(sub.allgather(value))


def measure(ctx, sub, A, part, args, gpu, graph_name):
    """One group: build, the product's parts, the transpose, a GCN epoch (the slowest rank's medians)."""
    import tcgnn_py as tg
    from tcgnn_py import distributed as dist

    xp, clock, P = ctx.xp, timer(gpu), ctx.world_size
    rows = []
    for halo in (args.halo_dtype if args.spmm else []):
        if gpu:
            xp.get_default_memory_pool().free_all_blocks()
        t0 = time.perf_counter()
        D = dist.DistributedMatrix(A, ctx, partition=part, halo_dtype=None if halo == "float32" else halo)
        ctx.synchronize()
        build_s = time.perf_counter() - t0
        X = xp.asarray(np.random.default_rng(ctx.rank).standard_normal((D.n_own, args.d), dtype=np.float32))
        mine = dict(spmm_s=clock(lambda: D.matmul(X), args.reps),
                    local_s=clock(lambda: tg.spmm(D.own, X), args.reps),
                    exchange_s=clock(lambda: D.exchange(X, None if halo == "float32" else halo), args.reps),
                    spmm_t_s=clock(lambda: D.rmatmul_t(X), args.reps), build_s=build_s,
                    received_gb=D.n_halo * args.d * (4 if halo == "float32" else 2) / 1e9,
                    halo_rows=D.n_halo, nnz=D.nnz, halo_nnz=D.halo.nnz, boundary_rows=int(D.boundary_rows.shape[0]))
        mem = D.memory()
        mine["bytes_per_entry"] = {k: v / max(mem["entries"], 1) for k, v in mem.items() if k != "entries"}
        every = sub.allgather(mine)
        r = dict(kind="spmm", graph=graph_name, gpus=P, halo_dtype=halo, d=args.d, partition=part.method,
                 partition_s=part.seconds)
        for k in ("spmm_s", "local_s", "exchange_s", "spmm_t_s", "build_s"):
            r[k] = max(e[k] for e in every)
        for k in ("halo_rows", "nnz", "halo_nnz", "boundary_rows"):
            r[k] = [e[k] for e in every]
        rates = [e["received_gb"] / max(e["exchange_s"], 1e-12) for e in every if e["received_gb"]]
        r["exchange_gbps_min"] = min(rates) if rates and P > 1 else None
        r["bytes_per_entry"] = {k: max(e["bytes_per_entry"][k] for e in every) for k in every[0]["bytes_per_entry"]}
        rows.append(r)
        del D, X
    if args.gcn:
        try:
            rows.append(gcn_epoch(ctx, sub, A, part, args, gpu, graph_name))
        except Exception as e:  # noqa: BLE001 -- one GPU out of memory is a result (one rank: no peer waits)
            if P > 1:
                raise
            rows.append(dict(kind="gcn", graph=graph_name, gpus=P, epoch_s=None, error=f"{type(e).__name__}: "
                             f"{str(e)[:100]}"))
    return rows


def gcn_epoch(ctx, sub, A, part, args, gpu, graph_name):
    import tcgnn_py as tg
    from tcgnn_py import distributed as dist

    xp = ctx.xp
    dims = tuple(int(x) for x in args.gcn.split(","))
    if gpu:
        xp.get_default_memory_pool().free_all_blocks()
    D = dist.DistributedMatrix(A, ctx, partition=part)  # the graph's own values: the epoch costs the same
    rng = np.random.default_rng(100 + ctx.rank)
    X = xp.asarray(rng.standard_normal((D.n_own, dims[0]), dtype=np.float32))
    labels = xp.asarray(rng.integers(0, dims[-1], D.n_own))
    train = xp.asarray(np.flatnonzero(rng.random(D.n_own) < 0.1))
    params = {k: xp.asarray(v) for k, v in tg.nn.gcn_init(dims, np.random.default_rng(0)).items()}
    opt = tg.nn.Adam(params, lr=0.01)
    mem0 = xp.get_default_memory_pool().used_bytes() if gpu else 0
    r = dist.train(ctx, tg.nn.gcn_apply, params, D, X, labels, (train, train[:0], train[:0]), opt,
                   epochs=args.epochs, rng=xp.random.default_rng(ctx.rank) if gpu else np.random.default_rng(ctx.rank),
                   evaluate=False)
    epoch = float(np.median(r.epoch_times[1:])) if len(r.epoch_times) > 1 else r.epoch_times[0]
    peak = xp.get_default_memory_pool().total_bytes() if gpu else 0
    return dict(kind="gcn", graph=graph_name, gpus=ctx.world_size, dims=dims, epoch_s=slowest(sub, epoch),
                pool_gb=slowest(sub, peak / 1e9), model_gb=slowest(sub, (peak - mem0) / 1e9))


def baseline(A, part, args, gpu):
    """One GPU, the whole graph in the given partition's order: the plain ``T @ X``, ``Tᵀ @ X`` and a GCN epoch
    with the plain layers (an out-of-memory is reported, not raised)."""
    import tcgnn_py as tg

    clock = timer(gpu)
    xp = __import__("cupy") if gpu else np
    B = part.permutation.apply(A)
    out = {}
    T = tg.TiledMatrix(B, device="cuda" if gpu else "cpu")
    X = xp.asarray(np.random.default_rng(0).standard_normal((B.shape[0], args.d), dtype=np.float32))
    if args.spmm:
        out["spmm_s"] = clock(lambda: T @ X, args.reps)
        out["spmm_t_s"] = clock(lambda: T.T @ X, args.reps)
    del X, B
    if args.gcn:
        dims = tuple(int(x) for x in args.gcn.split(","))
        try:
            rng = np.random.default_rng(1)
            n = T.shape[0]
            H = xp.asarray(rng.standard_normal((n, dims[0]), dtype=np.float32))
            labels = xp.asarray(rng.integers(0, dims[-1], n))
            train = xp.asarray(np.flatnonzero(rng.random(n) < 0.1))
            params = {k: xp.asarray(v) for k, v in tg.nn.gcn_init(dims, np.random.default_rng(0)).items()}
            opt = tg.nn.Adam(params, lr=0.01)
            res = tg.nn.train(tg.nn.gcn_apply, params, T, H, labels, (train, train[:0], train[:0]), opt,
                              epochs=args.epochs, rng=tg.nn.default_rng(1, like=T), evaluate=False)
            out["epoch_s"] = float(np.median(res.epoch_times[1:]))
        except Exception as e:  # noqa: BLE001 -- out of memory on one GPU is a result: say so
            out["epoch_s"] = None
            out["epoch_error"] = f"{type(e).__name__}: {str(e)[:100]}"
    return out


def run_graph(world, spec, args, gpu, per_gpu=False):
    """Every group size of ``--gpus`` on one graph (strong scaling), or on a graph per size (weak: ``per_gpu``)."""
    import tcgnn_py as tg
    from tcgnn_py import distributed as dist

    rows, A, part = [], None, None
    name = spec + (" per GPU" if per_gpu else "")
    method = None if args.partition == "none" else args.partition
    for P in args.gpus:
        if A is None or per_gpu:
            A = None
            t0 = time.perf_counter()
            A = tg.planted_partition_graph(**parse_graph(spec, P if per_gpu else 1), seed=1,
                                           device="cuda" if gpu else "cpu")
            gen_s = time.perf_counter() - t0
            sums = world.mpi_comm.allgather((int(A.nnz), int(A.indices[::1009].astype(np.int64).sum())))
            if len(set(sums)) != 1:  # synchronize! -- every rank must hold the same graph
                raise SystemExit(f"{name}: the ranks drew different graphs from one seed: {sums}")
        # Rank 0 partitions and sends the result: a partitioner need not give every rank the same answer.
        part = world.mpi_comm.bcast(dist.partition(A, P, method) if world.rank == 0 else None, root=0)
        ctx, sub = group(world, P, args)
        if ctx is not None:
            if sub.Get_rank() == 0:
                print(f"{name}: {A.shape[0]:,} nodes, {A.nnz:,} edges (drawn in {gen_s:.1f} s), {P} GPU(s), "
                      f"partition {part.method} {part.seconds:.1f} s", flush=True)
            got = measure(ctx, sub, A, part, args, gpu, name)
            if sub.Get_rank() == 0:
                rows += got
                for r in got:
                    print(json.dumps(r), flush=True)
            if ctx is not world:
                ctx.close()
        world.mpi_comm.Barrier()
    if args.baseline and not per_gpu:
        if world.rank == 0:
            base = baseline(A, part, args, gpu)
            base.update(kind="baseline", graph=name, gpus=1, order=part.method)
            rows.append(base)
            print(json.dumps(base), flush=True)
        world.mpi_comm.Barrier()
    return rows


def markdown(rows, command):
    """The multi-GPU results page: strong scaling per graph, the exchange, weak scaling, memory."""
    base = {(r["graph"], r["gpus"]): r for r in rows if r["kind"] == "baseline"}
    out = ["# Results: several GPUs", "", f"One run of `tools/dist_bench.py`, regenerate it with:", "", "```bash",
           command, "```", ""]
    spmm = [r for r in rows if r["kind"] == "spmm"]
    graphs = list(dict.fromkeys(r["graph"] for r in spmm if not r["graph"].endswith("per GPU")))
    out += ["## SpMM `A @ X` and `Aᵀ @ G` (ms, slowest rank's median)", "",
            "Efficiency = one GPU's plain `T @ X` on the same graph and order ÷ (P × time on P GPUs). "
            "`local`: the own-columns product alone; `exchange`: the halo exchange alone (pack, NCCL, wait) and "
            "the rate the slowest receiver gets.", "",
            "| graph | halo | GPUs | partition (s) | A @ X | efficiency | local | exchange | GB/s received | "
            "Aᵀ @ G | halo rows per rank (max) | boundary rows (max) |", "|---" * 12 + "|"]
    for g in graphs:
        b = base.get((g, 1))
        for r in [r for r in spmm if r["graph"] == g]:
            b = b if b and b.get("spmm_s") else None
            eff = f"{100 * b['spmm_s'] / (r['gpus'] * r['spmm_s']):.0f} %" if b else "–"
            rate = f"{r['exchange_gbps_min']:.0f}" if r["exchange_gbps_min"] else "–"
            out.append(f"| {g} | {r['halo_dtype']} | {r['gpus']} | {r['partition']} ({r['partition_s']:.1f}) | "
                       f"{1e3 * r['spmm_s']:.2f} | {eff} | {1e3 * r['local_s']:.2f} | {1e3 * r['exchange_s']:.2f} | "
                       f"{rate} | {1e3 * r['spmm_t_s']:.2f} | {max(r['halo_rows']):,} | {max(r['boundary_rows']):,} |")
        if b:
            out.append(f"| {g} | one GPU, plain `T @ X` ({b['order']} order) | 1 | – | {1e3 * b['spmm_s']:.2f} | "
                       f"100 % | – | – | – | {1e3 * b['spmm_t_s']:.2f} | – | – |")
    gcn = [r for r in rows if r["kind"] == "gcn"]
    if gcn:
        out += ["", "## GCN training epoch (ms, slowest rank's median)", "",
                "| graph | GPUs | epoch | efficiency | GPU memory pool (GB, largest rank) |", "|---|---|---|---|---|"]
        for r in gcn:
            b = base.get((r["graph"], 1))
            be = b.get("epoch_s") if b else None
            if r["epoch_s"] is None:
                out.append(f"| {r['graph']} | {r['gpus']} | {r['error']} | – | – |")
                continue
            eff = f"{100 * be / (r['gpus'] * r['epoch_s']):.0f} %" if be else "–"
            out.append(f"| {r['graph']} | {r['gpus']} | {1e3 * r['epoch_s']:.1f} | {eff} | {r['pool_gb']:.1f} |")
        for (g, _), b in base.items():
            if b.get("epoch_s"):
                out.append(f"| {g} | one GPU, plain layers | {1e3 * b['epoch_s']:.1f} | 100 % | – |")
            elif b.get("epoch_error"):
                out.append(f"| {g} | one GPU, plain layers | {b['epoch_error']} | – | – |")
    weak = [r for r in spmm if r["graph"].endswith("per GPU")]
    if weak:
        out += ["", "## Weak scaling (the same rows and entries per GPU)", "",
                "| graph | halo | GPUs | A @ X ms | efficiency (1 GPU's time ÷ this) |", "|---|---|---|---|---|"]
        for r in weak:
            one = next((w for w in weak if w["gpus"] == 1 and w["halo_dtype"] == r["halo_dtype"]), None)
            eff = f"{100 * one['spmm_s'] / r['spmm_s']:.0f} %" if one else "–"
            out.append(f"| {r['graph']} | {r['halo_dtype']} | {r['gpus']} | {1e3 * r['spmm_s']:.2f} | {eff} |")
    out += ["", "## Memory per stored entry (bytes, the largest rank)", "",
            "| graph | halo | GPUs | own tiling | halo tiling | transposes | plans | exchange |", "|---" * 8 + "|"]
    for r in spmm:
        m = r["bytes_per_entry"]
        out.append(f"| {r['graph']} | {r['halo_dtype']} | {r['gpus']} | {m['own']:.1f} | {m['halo']:.1f} | "
                   f"{m['transposes']:.1f} | {m['plans']:.1f} | {m['exchange']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", nargs="+", default=["planted:20000000:240000000:64"])
    ap.add_argument("--weak", nargs="*", default=[], help="N:M:C per GPU, e.g. 5000000:60000000:16")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--halo-dtype", nargs="+", default=["float32"], choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--partition", default="auto", choices=["auto", "metis", "lp", "none"])
    ap.add_argument("--gcn", default="128,64,16", help="layer widths; empty to skip")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--no-baseline", dest="baseline", action="store_false")
    ap.add_argument("--no-spmm", dest="spmm", action="store_false", help="GCN epochs only")
    ap.add_argument("--backend", default="nccl", choices=["nccl", "reference"])
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json")
    ap.add_argument("--page")
    args = ap.parse_args(argv)
    from tcgnn_py import distributed as dist

    world = dist.init(backend=args.backend, timeout=args.timeout)
    if max(args.gpus) > world.world_size:
        raise SystemExit(f"--gpus {max(args.gpus)}: the job has {world.world_size} ranks (mpirun -n)")
    gpu = args.backend == "nccl"
    rows = []
    for spec in args.graph:
        rows += run_graph(world, spec, args, gpu)
    for spec in args.weak:
        rows += run_graph(world, "planted:" + spec, args, gpu, per_gpu=True)
    if world.rank == 0:
        command = "mpirun -n {} python tools/dist_bench.py ".format(world.world_size) + " ".join(sys.argv[1:])
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
        if args.page:
            pathlib.Path(args.page).write_text(markdown(rows, command))
        print(markdown(rows, command))
    world.close()


if __name__ == "__main__":
    main()
