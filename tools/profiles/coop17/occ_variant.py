# Patch the checkout's products.py (device copy only): more CTAs per SM for the 1-group kernels.
import sys
p = "tcgnn_py/kernels/products.py"
s = open(p).read()
a = "__launch_bounds__(128, (FS >= 2 ? 6 : 8))\ntcgnn_spmm_vec_async("
b = "__launch_bounds__(128, (FS >= 4 ? 4 : 8))\ntcgnn_spmm_vech("
assert a in s and b in s
n = sys.argv[1]
s = s.replace(a, f"__launch_bounds__(128, (FS >= 2 ? 6 : {n}))\ntcgnn_spmm_vec_async(")
s = s.replace(b, f"__launch_bounds__(128, (FS >= 4 ? 4 : FS >= 2 ? 8 : {n}))\ntcgnn_spmm_vech(")
open(p, "w").write(s)
