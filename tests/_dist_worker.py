"""One process of a multi-process group (run by ``python -m tcgnn_py.distributed``) for the GPU tests.

``products``: check this rank's rows of A @ X, Aᵀ @ G and SDDMM against scipy, exactly;
``die``: rank 1 exits with code 3 after joining; ``stall``: rank 1 sleeps instead of joining a collective.
"""

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from tcgnn_py import distributed as dist  # noqa: E402
import _dist_cases as cases  # noqa: E402


def main(mode):
    ctx = dist.init(rendezvous_timeout=60)
    if mode == "products":
        A = cases.GRAPHS["power_law"]()
        X, G = cases.int_features(A.shape[0], 33, 1), cases.int_features(A.shape[0], 8, 2)
        for halo in dist.HALO_MODES:
            mine = cases.products(A, X, G, halo=halo)(ctx)
            # Gather every rank's rows to check the whole product on each rank.
            rows = ctx.allgather(ctx.xp.asarray([mine[0][0].shape[0]], np.int64)).get()[:, 0]
            pad = int(rows.max())
            parts = []
            for k, d in ((0, 33), (1, 8)):
                block = np.zeros((pad, d), np.float32)
                block[:rows[ctx.rank]] = mine[0][k]
                g = ctx.allgather(ctx.xp.asarray(block)).get()
                parts.append(np.concatenate([g[r][:rows[r]] for r in range(ctx.world_size)]))
            np.testing.assert_array_equal(parts[0], (A @ X).astype(np.float32))
            np.testing.assert_array_equal(parts[1], (A.T @ G).astype(np.float32))
        print(f"rank {ctx.rank}: products exact", flush=True)
    elif mode == "die":
        if ctx.rank == 1:
            sys.exit(3)
        ctx.barrier()  # would wait for rank 1 forever
    elif mode == "stall":
        if ctx.rank == 1:
            time.sleep(120)
        ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1])
