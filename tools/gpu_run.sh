#!/usr/bin/env bash
# One device call: GPU test suite, compute-sanitizer memcheck, benchmarks.
# Run from the repo root on the GPU machine after ../shared/tools/prepare-gpu.sh staged .whl and .gpu.
# STEPS picks what runs (default: "test memcheck examples bench gnn reorder asv"); PYTEST_ARGS, BENCH_GRAPHS,
# BENCH_ARGS, GNN_GRAPHS, GNN_ARGS (e.g. --baselines FILE.py --sys-path DIR), REORDER_GRAPHS, REORDER_ARGS and ASV_ARGS customise; COMMIT is the hash asv files results under (the
# device's copy of .git may lag the checkout: run `git bundle create .gpu/head.bundle BASE..HEAD` here and
# pass COMMIT=$(git rev-parse HEAD)).  .whl carries numpy 2.4.6 and asv with its dependencies.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 TCGNN_PY_DATA=$PWD/.gpu/data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-test memcheck examples bench gnn reorder asv}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import numpy, numba, numba_cuda, cupy, scipy; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__, 'scipy', scipy.__version__)" | tee -a "$OUT/gpu.txt"
if [[ " $STEPS " == *" test "* ]]; then
  echo "== pytest (GPU) =="
  python3 -m pytest -q -n 4 -p no:cacheprovider -rfEs ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  echo "== examples/quickstart.py (GPU) =="
  python3 examples/quickstart.py 2>&1 | tee "$OUT/quickstart.log" | tail -4
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [[ " $STEPS " == *" memcheck "* ]]; then
  echo "== memcheck: SGT =="
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 -c "
import numpy as np, tcgnn_py as tg
A = tg.power_law_graph(3000, 30000, seed=2)
T = tg.TiledMatrix(A); T.check_format(full_check=True)
assert (T.tocsr() != A).nnz == 0 and (T.T.tocsr() != A.T).nnz == 0
print('memcheck SGT workload ok', T)
" > "$OUT/memcheck.log" 2>&1 || rc=1
  tail -3 "$OUT/memcheck.log"
  echo "== memcheck: SpMM / SDDMM =="
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 tools/memcheck_products.py \
    > "$OUT/memcheck_products.log" 2>&1 || rc=1
  tail -3 "$OUT/memcheck_products.log"
  echo "== memcheck: nn (GCN, AGNN training steps, Adam kernel, shared-tiling transposes) =="
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 tools/memcheck_nn.py \
    > "$OUT/memcheck_nn.log" 2>&1 || rc=1
  tail -3 "$OUT/memcheck_nn.log"
  echo "== memcheck: tcgnn_py.jax (every operation inside jax.jit; host backtraces off, see the tool) =="
  # The sanitizer itself dies now and then in this workload (a segmentation fault before any report: see the tool):
  # a run that died so is run again, up to 3 times, its log kept aside; one that completed or reported anything is not.
  for attempt in 1 2 3; do
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 --show-backtrace no \
      python3 tools/memcheck_jax.py > "$OUT/memcheck_jax.log" 2>&1
    code=$?
    if [ $code -lt 128 ] || grep -v "COMPUTE-SANITIZER" "$OUT/memcheck_jax.log" | grep -q "^========="; then break; fi
    mv "$OUT/memcheck_jax.log" "$OUT/memcheck_jax.died$attempt.log"
    echo "compute-sanitizer died (exit $code) before any report, attempt $attempt of 3"
  done
  [ $code -eq 0 ] || rc=1
  tail -3 "$OUT/memcheck_jax.log"
  echo "== memcheck: reorder =="
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 python3 -c "
import numpy as np, tcgnn_py as tg
A = tg.power_law_graph(1001, 6000, seed=4, symmetric=True)
for pattern in ('2:4', (4, 2, 8), (1, 3, 32)):
    g, c = tg.reorder(A, pattern, device='cuda', max_iter=2), tg.reorder(A, pattern, device='cpu', max_iter=2)
    assert (g.perm == c.perm).all(), pattern
    print('memcheck reorder', g.report)
for layout in ('tcgnn', 'vector'):
    g, c = tg.reorder(A, 'locality', layout=layout, device='cuda'), tg.reorder(A, 'locality', layout=layout, device='cpu')
    assert (g.perm == c.perm).all(), layout
    print('memcheck reorder', g.report)
" > "$OUT/memcheck_reorder.log" 2>&1 || rc=1
  tail -4 "$OUT/memcheck_reorder.log"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  echo "== benchmarks: python -m tcgnn_py.bench =="
  python3 -m tcgnn_py.bench ${BENCH_GRAPHS:-cora pubmed facebook blogcatalog3 powerlaw:1000000:16000000} \
    ${BENCH_ARGS:-} --json "$OUT/bench.json" --markdown "$OUT/bench.md" --plot "$OUT/bench.png" \
    > "$OUT/bench.log" 2>&1 || rc=1
  tail -40 "$OUT/bench.log"
fi
if [[ " $STEPS " == *" examples "* ]]; then
  for ex in gcn_cora agnn_cora dlpack_interop; do
    echo "== examples/$ex.py (GPU) =="
    python3 examples/$ex.py 2>&1 | tee "$OUT/$ex.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
  echo "== examples/locality_gcn.py (GPU): Cora, and facebook_pagepage (22k vertices, 342k entries) =="
  python3 examples/locality_gcn.py 2>&1 | tee "$OUT/locality_gcn.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  python3 examples/locality_gcn.py --graph .gpu/data/facebook_pagepage --min-accuracy 0.5 2>&1 \
    | tee "$OUT/locality_gcn_facebook_pagepage.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  for ex in gcn_cora agnn_cora; do  # a captured step replayed (CUDA graph), in float32 and float16
    for dt in float32 float16; do
      echo "== examples/$ex.py --cuda-graph --dtype $dt (GPU) =="
      python3 examples/$ex.py --cuda-graph --dtype $dt 2>&1 | tee "$OUT/${ex}_graph_$dt.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    done
  done
  for ex in gcn_cora agnn_cora; do  # mixed precision: 16-bit activations, float32 master weights
    for dt in float16 bfloat16; do
      echo "== examples/$ex.py --dtype $dt (GPU) =="
      python3 examples/$ex.py --dtype $dt 2>&1 | tee "$OUT/${ex}_$dt.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    done
  done
fi
if [[ " $STEPS " == *" gnn "* ]]; then
  echo "== epoch times: tools/gnn_epoch_table.py =="
  python3 tools/gnn_epoch_table.py ${GNN_GRAPHS:-cora citeseer pubmed blogcatalog3 powerlaw:1000000:16000000} \
    ${GNN_ARGS:-} --json "$OUT/gnn.json" --markdown "$OUT/gnn.md" > "$OUT/gnn.log" 2>&1 || rc=1
  cat "$OUT/gnn.md" 2>/dev/null || tail -30 "$OUT/gnn.log"
fi
if [[ " $STEPS " == *" reorder "* ]]; then
  echo "== reorder quality and speed =="
  all=$(ls .gpu/data | tr '\n' ' ')
  python3 tools/reorder_report.py ${REORDER_ARGS---best} --json "$OUT/reorder.json" \
    ${REORDER_GRAPHS:-$all powerlaw:20000:100000 powerlaw:100000:1000000} 2>&1 | tee "$OUT/reorder.log" || rc=1
fi
if [[ " $STEPS " == *" asv "* ]]; then
  echo "== asv run --python=same ${ASV_ARGS---quick} =="
  # asv drops PYTHONPATH from benchmark processes; ASV_PYTHONPATH is its way in.
  # The device's .git may lag: fetch the commits bundled into .gpu/head.bundle (see the top).
  [ -f .gpu/head.bundle ] && git fetch -q .gpu/head.bundle "+HEAD:refs/asv/head" 2>/dev/null
  (cd asv_bench && python3 -m asv machine --yes > /dev/null \
    && ASV_PYTHONPATH=$PYTHONPATH python3 -m asv run --python=same ${ASV_ARGS---quick} \
       --set-commit-hash "${COMMIT:-$(git rev-parse HEAD)}" > "$OUT/asv.log" 2>&1 \
    && python3 -m asv publish >> "$OUT/asv.log" 2>&1 && tar czf "$OUT/asv-results.tgz" results html) || rc=1
  grep -E "failed|Traceback" "$OUT/asv.log" | head; grep -c " ok$" "$OUT/asv.log" | sed 's/^/asv benchmarks ok: /'
fi
exit $rc
