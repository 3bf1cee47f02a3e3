"""Layer 2: the product families, one module each: its launch rule (from the tiling's statistics, with its
reason), the candidates its timed choice compares, and the one place its kernels' arguments are written.

``tf32`` (16x8 TF32), ``core`` (CUDA cores), ``vec`` (vector layout, TF32), ``half`` (vector layout, 16-bit X),
``sparse`` (N:M layouts, ``mma.sp``), ``attention`` (fused graph attention), ``dense`` (a layer's own dense
products), ``pointwise`` (a layer's elementwise tail and vjp, the loss, per-head and per-row helpers) and
``optimizer`` (Adam).  A family imports no sibling: what two share lives below them in the engine.
"""
