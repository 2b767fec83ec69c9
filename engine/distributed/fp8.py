"""FP8 GEMMs of the decoder's linear layers (--fp8; docs/fp8.md): dynamic scaling, torch._scaled_mm.

A linear y = x W^T runs three GEMMs, each written here as A B^T with the reduction dimension K last in
both operands (what `torch._scaled_mm(a, b.t())` wants: a row-major, b column-major):

    forward  y  = x  W^T     A = x [n, in],    B = W   [out, in]     K = in
    dgrad    dx = dy W       A = dy [n, out],  B = W^T [in, out]     K = out
    wgrad    dW = dy^T x     A = dy^T [out, n], B = x^T [in, n]      K = n (tokens)

Every operand is cast to FP8 with a scale computed from its own amax at the time (dynamic scaling, no
history): q = clamp(t * scale, -max, max) cast, scale = max / amax (1 where amax is 0), and the GEMM
multiplies the product back by 1 / (scale_a scale_b) in its epilogue. The recipes follow torchao's:

- tensorwise: one scale per tensor; activations and weights E4M3 (max 448, 3 mantissa bits), the output
  gradient E5M2 (max 57344, 2 mantissa bits: range before precision for gradients). cuBLAS's FP8 GEMM.
- rowwise: one scale per row of each operand along K (so a row's scale never mixes with another row's
  amax), everything E4M3, scales rounded down to a power of two (exact to apply). CUTLASS rowwise GEMM.

Outputs are in the model dtype (bf16 on the GPU), as the bf16 path's; a weight gradient that goes into
the fp32 `main_grad` (gradient-accumulation fusion) is produced in fp32 by the tensorwise GEMM and in
the model dtype by the rowwise one (torch's rowwise kernel writes bf16), then added. Only the GEMM
operands are FP8: the saved activations, master weights, optimizer and every other op are unchanged.

Tensor parallelism: each rank scales its own shard (amax local, no collective). A column-parallel
layer's input is the same on every rank, so its scale is too; weights and row-parallel inputs are
shards whose amax differs per rank, and each rank's partial product is dequantized before the TP
all-reduce, so the sum is of bf16 partials exactly as without FP8. A global amax would cost an
all-reduce per operand per GEMM on the critical path and changes the result only through which scale
each shard rounds with (tests/engine/test_fp8.py bounds the sharded-vs-unsharded difference).

On CPU torch._scaled_mm runs the same casts and scales (fp32 arithmetic): the emulation the numerics
tests use; on CUDA it needs compute capability 8.9 (Ada, Hopper) or newer (`check_fp8_device`).
`reference_linear_fp8` is the plain-torch reference: the same quantisation, dequantised and multiplied
in fp32.
"""

import torch

from engine.config import FP8_RECIPES
from engine.errors import ConfigError

__all__ = ["FP8_RECIPES", "E4M3", "E5M2", "amax_scale", "quantize", "scaled_mm_nt", "linear_forward", "linear_dgrad",
           "linear_wgrad", "reference_linear_fp8", "check_fp8_device"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def amax_scale(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool) -> torch.Tensor:
    """fp32 scale mapping t's amax (over all of t, or over `dim`, kept) to the largest finite value of `dtype`.
    An amax of 0 (an all-zero tensor or row) gets scale 1: the zeros cast exactly, and nothing divides by 0."""
    # one reduction kernel, no |t| materialised: the inf-norm is the amax
    amax = torch.linalg.vector_norm(t.detach(), ord=float("inf"), dim=dim, keepdim=dim is not None, dtype=torch.float32)
    scale = torch.where(amax > 0, torch.finfo(dtype).max / amax, torch.ones_like(amax))
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def quantize(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 tensor, fp32 scale). The clamp keeps values the scale maps past the range (only a rounding of the
    scale can) finite: FP8 E4M3 has no inf, and a cast beyond it would give nan."""
    scale = amax_scale(t, dtype, dim, pow2)
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp_(-fmax, fmax).to(dtype), scale


def scaled_mm_nt(a: torch.Tensor, b: torch.Tensor, recipe: str, out_dtype: torch.dtype,
                 a_dtype: torch.dtype = E4M3) -> torch.Tensor:
    """a @ b^T (a [m, k], b [n, k]) with both operands cast to FP8 by `recipe`; `a_dtype`: the first operand's
    format (E5M2 for a tensorwise output gradient)."""
    rowwise = recipe == "rowwise"
    dim = -1 if rowwise else None
    qa, sa = quantize(a, E4M3 if rowwise else a_dtype, dim, pow2=rowwise)
    qb, sb = quantize(b, E4M3, dim, pow2=rowwise)
    if rowwise:  # scale_a [m, 1], scale_b [1, n]; torch's rowwise kernel writes bf16 on CUDA
        out = torch.bfloat16 if a.is_cuda else out_dtype
        y = torch._scaled_mm(qa, qb.t(), scale_a=sa.reciprocal(), scale_b=sb.reciprocal().t(), out_dtype=out)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return torch._scaled_mm(qa, qb.t(), scale_a=sa.reciprocal(), scale_b=sb.reciprocal(), out_dtype=out_dtype)


def _grad_dtype(recipe: str) -> torch.dtype:
    return E5M2 if recipe == "tensorwise" else E4M3


def linear_forward(x2: torch.Tensor, w: torch.Tensor, recipe: str) -> torch.Tensor:
    """x2 [n, in] @ w^T -> [n, out] in x2's dtype."""
    return scaled_mm_nt(x2.contiguous(), w.contiguous(), recipe, x2.dtype)


def linear_dgrad(g2: torch.Tensor, w: torch.Tensor, recipe: str) -> torch.Tensor:
    """dy [n, out] @ w -> dx [n, in] in dy's dtype."""
    return scaled_mm_nt(g2.contiguous(), w.t().contiguous(), recipe, g2.dtype, _grad_dtype(recipe))


def linear_wgrad(g2: torch.Tensor, x2: torch.Tensor, recipe: str, out_dtype: torch.dtype) -> torch.Tensor:
    """dy^T [out, n] @ x [n, in] -> dW [out, in] in `out_dtype` (fp32 for a main_grad)."""
    return scaled_mm_nt(g2.t().contiguous(), x2.t().contiguous(), recipe, out_dtype, _grad_dtype(recipe))


def _fake_quant_nt(a: torch.Tensor, b: torch.Tensor, recipe: str, a_dtype: torch.dtype) -> torch.Tensor:
    """The reference of scaled_mm_nt: quantise, dequantise in fp32, multiply in fp32."""
    rowwise = recipe == "rowwise"
    dim = -1 if rowwise else None
    qa, sa = quantize(a, E4M3 if rowwise else a_dtype, dim, pow2=rowwise)
    qb, sb = quantize(b, E4M3, dim, pow2=rowwise)
    return (qa.float() / sa) @ (qb.float() / sb).t()


def reference_linear_fp8(x2: torch.Tensor, w: torch.Tensor, g2: torch.Tensor, recipe: str) -> tuple:
    """Plain-torch (y, dx, dW) of one FP8 linear in fp32 (x2 [n, in], w [out, in], g2 = dy [n, out])."""
    x2, w, g2 = x2.float(), w.float(), g2.float()
    ga = _grad_dtype(recipe)
    return (_fake_quant_nt(x2, w, recipe, E4M3), _fake_quant_nt(g2, w.t(), recipe, ga),
            _fake_quant_nt(g2.t(), x2.t(), recipe, ga))


def check_fp8_device(fp8: str, device_type: str, capability: tuple[int, int] | None) -> None:
    """Refuse --fp8 where there are no FP8 tensor cores: a CUDA GPU below compute capability 8.9. CPU runs the
    emulation (torch._scaled_mm's CPU kernel: the same numerics, no speed), which the tests use."""
    if fp8 == "off" or device_type != "cuda" or capability is None or tuple(capability) >= (8, 9):
        return
    raise ConfigError("--fp8", fp8, "run on a GPU of compute capability 8.9 or newer (Ada, Hopper: H100, H200) or "
                      "leave out --fp8", f"needs FP8 tensor cores, and this GPU has compute capability "
                      f"{capability[0]}.{capability[1]}")
