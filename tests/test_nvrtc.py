"""Every CuPy kernel source compiles through NVRTC for sm_80 and sm_90 -- no GPU needed.

CuPy's own compile path needs a driver, so these call NVRTC directly (the
``nvidia-cuda-nvrtc`` wheel through ``cuda.bindings``), with the same source,
options and name expressions as :func:`tcgnn_py.kernels.registry.get_kernel`, for
every family of :func:`~tcgnn_py.kernels.registry.families` (the benchmarks'
baseline family included: importing ``tcgnn_py.bench`` registers it).
A syntax error, a bad template instantiation or a PTX the target rejects fails.
"""

import re

import pytest

import tcgnn_py.bench  # noqa: F401  (registers the "baseline" family)
from tcgnn_py.kernels import registry

FAMILIES = registry.families()

ARCHS = ["sm_80", "sm_90"]


def nvrtc_compile(code, names, arch, options=registry.OPTIONS):
    """``(ok, log, ptx, lowered names)`` of one NVRTC compile."""
    from cuda.bindings import nvrtc

    def ok(res):
        assert res[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS, res[0]
        return res[1] if len(res) > 1 else None

    prog = ok(nvrtc.nvrtcCreateProgram(code.encode(), b"tcgnn.cu", 0, [], []))
    try:
        for n in names:
            ok(nvrtc.nvrtcAddNameExpression(prog, n.encode()))
        opts = [o.encode() for o in options] + [f"-arch={arch}".encode()]
        status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        log = bytearray(ok(nvrtc.nvrtcGetProgramLogSize(prog)))
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = bytes(log).rstrip(b"\0").decode()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, log, "", {}
        ptx = bytearray(ok(nvrtc.nvrtcGetPTXSize(prog)))
        nvrtc.nvrtcGetPTX(prog, ptx)
        lowered = {n: ok(nvrtc.nvrtcGetLoweredName(prog, n.encode())).decode() for n in names}
        return True, log, bytes(ptx).rstrip(b"\0").decode(), lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_compiles(family, arch):
    code, names = FAMILIES[family]
    ok, log, ptx, lowered = nvrtc_compile(code, names, arch)
    assert ok, log
    assert f".target {arch}" in ptx
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    for name, mangled in lowered.items():
        assert name.startswith("tcgnn_"), name
        assert mangled in entries, f"{name} ({mangled}) has no kernel in the PTX"
    if family in ("tf32", "vec"):
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
        assert "cvt.rna.tf32.f32" in ptx
    if family == "half":
        for t in ("f16", "bf16"):
            assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in ptx
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
        assert "cp.async.ca.shared.global" in ptx  # X rows through L1
    if family == "vec":  # the TF32 cp.async copies through L2, and through L1 in the VEC_ASYNC_L1 shapes
        assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx


def test_every_family_is_listed():
    assert {"tf32", "core", "vec", "half", "nn", "baseline"} <= set(FAMILIES)


def test_name_tables_cover_every_kernel():
    """Every ``__global__`` template of a source is instantiated, and nothing else is named."""
    for family, (code, names) in FAMILIES.items():
        kernels = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s+)?(\w+)", code))
        assert kernels == {n.split("<")[0] for n in names}, family


def test_compile_check_catches_errors():
    """The check above is not vacuous: a typo and a bad PTX instruction both fail."""
    code, names = FAMILIES["tf32"]
    ok, log, _, _ = nvrtc_compile(code.replace("tc_add4(s, red", "tc_add4(s red", 1), names, "sm_90")
    assert not ok and "error" in log
    bad_ptx = code.replace("mma.sync.aligned.m16n8k8.row.col.f32.tf32", "mma.sync.aligned.m16n8k9.row.col.f32.tf32", 1)
    ok, log, _, _ = nvrtc_compile(bad_ptx, names, "sm_90")
    assert not ok
