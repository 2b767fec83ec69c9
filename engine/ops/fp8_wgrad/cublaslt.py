"""fp8_wgrad on cuBLASLt with beta = 1: the FP8 weight gradient added into the fp32 accumulator in the GEMM's own
epilogue, through the cuBLASLt library torch's CUDA build links (ctypes; nothing compiled).

Why: torch._scaled_mm takes no beta, so the baseline writes each FP8 weight gradient as an fp32 [m, n] product and
adds it to the accumulator: 12 bytes a parameter more than the GEMM reading the accumulator itself (18 ms of the
4-layer 8B slice's step on an H200, docs/fp8.md). cuBLASLt's matmul is D = alpha * scale_A * scale_B * op(A) op(B)
+ beta * C for FP8 A and B with fp32 C and D; torch only does not expose the C. The kernels are cuBLAS's own (the
baseline's family, with a C read), with the same accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM 0: partial sums
promoted to fp32) and the same dequantisation scales (1 / s as device pointers, as torch passes them: no host
sync). Quack's epilogue add (quack_add.py) is the other way in; its promotion made it 3.2x slower.

Layout: out [m, n] row-major is cuBLASLt's column-major D [n, m]; A is qb ([n, k] row-major = column-major [k, n],
transposed), B is qa (column-major [k, m], not transposed): the "TN" form Hopper's FP8 GEMMs require. The heuristic's
first algorithm for a shape (and the operands' alignments) is kept for the process, so a shape always runs the same
kernel: bit for bit run to run, and inside CUDA graphs (the descriptors are host state; the call only enqueues).
"""

# guard: allow isolation -- cuBLASLt's FP8 matmul with a C, which torch does not expose; this file calls libcublasLt only
import ctypes
import threading

import torch

from engine.distributed.fp8 import E4M3, E5M2, check_wgrad
from engine.errors import KernelLoadError

__all__ = ["wgrad_add"]

# cublasLt.h / cublas_api.h / library_types.h (stable across CUDA 12 and 13)
_COMPUTE_32F, _R_32F = 68, 0
_TYPES = {E4M3: 28, E5M2: 29}  # CUDA_R_8F_E4M3, CUDA_R_8F_E5M2
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB, _DESC_A_SCALE, _DESC_B_SCALE, _DESC_FAST_ACCUM = 3, 4, 17, 18, 25
_PREF_MAX_WORKSPACE = 1
_PREF_ALIGN = {"A": 5, "B": 6, "C": 7, "D": 8}  # CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES
WORKSPACE_BYTES = 32 * 2 ** 20  # what torch gives its own cuBLASLt calls on Hopper


class _Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _library() -> ctypes.CDLL:
    """The libcublasLt torch's CUDA build links (opened by its soname, which finds the copy torch already loaded), so
    the kernels and version are the ones torch's own GEMMs use."""
    major = (torch.version.cuda or "").split(".")[0]
    name = f"libcublasLt.so.{major}"
    try:
        if not major:
            raise OSError("this torch is not a CUDA build")
        return ctypes.CDLL(name)
    except OSError as e:
        raise KernelLoadError("fp8_wgrad", "cublaslt", "engine.ops.fp8_wgrad.cublaslt:wgrad_add",
                              f"cannot open {name} ({e})", "use --op-fp8-wgrad baseline") from e


class _Lt:
    """One process's cuBLASLt: the library, a handle and a workspace per device, and a plan (descriptors, layouts,
    algorithm) per shape. Used under _LOCK only (the plans' descriptors take each call's scales)."""

    def __init__(self):
        self.lib = _library()
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.workspaces: dict[int, torch.Tensor] = {}
        self.plans: dict[tuple, tuple] = {}

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"fp8_wgrad (cublaslt): {what} returned cublasStatus_t {status}: use --op-fp8-wgrad "
                               f"baseline")

    def handle(self, device: int) -> ctypes.c_void_p:
        if device not in self.handles:
            h = ctypes.c_void_p()
            self.check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
            self.handles[device] = h
            self.workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")
        return self.handles[device]

    def set_attr(self, setter, obj, attr: int, value) -> None:
        self.check(setter(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), f"{setter.__name__}({attr})")

    def layout(self, dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), ctypes.c_int(dtype), ctypes.c_uint64(rows),
                                                       ctypes.c_uint64(cols), ctypes.c_int64(ld)),
                   "cublasLtMatrixLayoutCreate")
        return layout

    def plan(self, device: int, m: int, n: int, k: int, a_type: int, b_type: int, aligns: dict) -> tuple:
        """(descriptor, layouts of A, B and C = D, algorithm) for out [m, n] += qa [m, k] @ qb [n, k]^T."""
        key = (device, m, n, k, a_type, b_type, tuple(sorted(aligns.items())))
        if key in self.plans:
            return self.plans[key]
        lib = self.lib
        desc = ctypes.c_void_p()
        self.check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ctypes.c_int(_COMPUTE_32F), ctypes.c_int(_R_32F)),
                   "cublasLtMatmulDescCreate")
        self.set_attr(lib.cublasLtMatmulDescSetAttribute, desc, _DESC_TRANSA, ctypes.c_int32(_OP_T))
        self.set_attr(lib.cublasLtMatmulDescSetAttribute, desc, _DESC_TRANSB, ctypes.c_int32(_OP_N))
        self.set_attr(lib.cublasLtMatmulDescSetAttribute, desc, _DESC_FAST_ACCUM, ctypes.c_int8(0))
        a = self.layout(b_type, k, n, k)  # qb: column-major [k, n], transposed by the GEMM
        b = self.layout(a_type, k, m, k)  # qa: column-major [k, m]
        c = self.layout(_R_32F, n, m, n)  # out: column-major [n, m]; C and D are the same buffer
        pref = ctypes.c_void_p()
        self.check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        set_pref = lib.cublasLtMatmulPreferenceSetAttribute
        self.set_attr(set_pref, pref, _PREF_MAX_WORKSPACE, ctypes.c_uint64(WORKSPACE_BYTES))
        for name, bytes_ in aligns.items():
            self.set_attr(set_pref, pref, _PREF_ALIGN[name], ctypes.c_uint32(bytes_))
        result, found = _Heuristic(), ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(self.handle(device), desc, a, b, c, c, pref, 1,
                                                    ctypes.byref(result), ctypes.byref(found))
        lib.cublasLtMatmulPreferenceDestroy(pref)
        if status != 0 or found.value == 0:
            raise ValueError(f"fp8_wgrad (cublaslt): cuBLASLt has no FP8 GEMM adding into fp32 for out [{m}, {n}] "
                             f"from k = {k} (status {status}, alignments {aligns}): use --op-fp8-wgrad baseline")
        plan = (desc, a, b, c, result.algo)
        self.plans[key] = plan
        return plan


_LT: _Lt | None = None
_LOCK = threading.Lock()


def _lt() -> _Lt:
    """The process's _Lt, made at the first call (under _LOCK)."""
    global _LT
    if _LT is None:
        _LT = _Lt()
    return _LT


def _alignment(t: torch.Tensor) -> int:
    """The largest power of two (at most 256) dividing t's address: what the heuristic may assume of it."""
    ptr = t.data_ptr()
    return min(256, ptr & -ptr) if ptr else 256


def wgrad_add(out: torch.Tensor, qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor) -> None:
    """out += (qa / sa) @ (qb / sb)^T (engine/ops/fp8_wgrad/register.toml)."""
    check_wgrad(out, qa, qb, "cublaslt")
    if qa.dtype == E5M2 and qb.dtype == E5M2:
        raise ValueError("fp8_wgrad (cublaslt): cuBLASLt multiplies no two E5M2 operands: use --op-fp8-wgrad baseline")
    (m, k), n = qa.shape, qb.shape[0]
    device = out.device.index
    aligns = {"A": _alignment(qb), "B": _alignment(qa), "C": _alignment(out), "D": _alignment(out)}
    inv_a, inv_b = sa.reciprocal(), sb.reciprocal()  # the dequantisation scales, as _scaled_mm's (1 / s)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(1.0)
    with _LOCK, torch.cuda.device(device):
        lt = _lt()
        desc, a, b, c, algo = lt.plan(device, m, n, k, _TYPES[qa.dtype], _TYPES[qb.dtype], aligns)
        lt.set_attr(lt.lib.cublasLtMatmulDescSetAttribute, desc, _DESC_A_SCALE, ctypes.c_void_p(inv_b.data_ptr()))
        lt.set_attr(lt.lib.cublasLtMatmulDescSetAttribute, desc, _DESC_B_SCALE, ctypes.c_void_p(inv_a.data_ptr()))
        workspace = lt.workspaces[device]
        status = lt.lib.cublasLtMatmul(
            lt.handle(device), desc, ctypes.byref(alpha), ctypes.c_void_p(qb.data_ptr()), a,
            ctypes.c_void_p(qa.data_ptr()), b, ctypes.byref(beta), ctypes.c_void_p(out.data_ptr()), c,
            ctypes.c_void_p(out.data_ptr()), c, ctypes.byref(algo), ctypes.c_void_p(workspace.data_ptr()),
            ctypes.c_size_t(WORKSPACE_BYTES), ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream))
        lt.check(status, "cublasLtMatmul")
