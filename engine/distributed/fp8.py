"""FP8 GEMMs of the decoder's linear layers (--fp8; docs/fp8.md): dynamic scaling, torch._scaled_mm.

Why and how: docs/engine/distributed.md, section `engine/distributed/fp8.py`.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from engine.config import FP8_RECIPES
from engine.distributed.fp8_weight import Fp8Weight
from engine.errors import ConfigError

__all__ = ["FP8_RECIPES", "E4M3", "E5M2", "Fp8Recipe", "Fp8Operand", "scale_for", "amax_of", "amax_scale", "scaled_cast", "quantize", "cast",
           "check_cast", "keeps_fp8", "fp8_copy", "weight_copies_kept", "kept_weight_copies", "weight_copy", "grad_operand", "rows",
           "save_operands", "saved_operands", "scaled_mm_nt", "linear_forward", "linear_dgrad", "linear_wgrad",
           "scaled_wgrad_add", "check_wgrad", "wgrad_add", "reference_linear_fp8", "check_fp8_device"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def scale_for(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fp32 scale mapping `amax` (fp32) to the largest finite value of `dtype`: max(dtype) x (1 / amax), two fp32
    roundings. An amax of 0 (an all-zero tensor or row) gets scale 1: the zeros cast exactly, and nothing divides by
    0 (a scalar 1: no fill kernel). The one formula of every fp8_cast version (the compiled cast's graph calls it too).
    1 / amax is formed in fp64 and rounded to fp32: a correctly rounded fp64 quotient rounds to the correctly rounded
    fp32 one (double rounding is innocuous for a quotient when 53 >= 2 x 24 + 2 bits), so these are the bits of
    torch's IEEE fp32 reciprocal, which Triton's fp32 division (approximate: div.full) would not give in a graph."""
    return torch.where(amax > 0, (1.0 / amax.double()).float() * torch.finfo(dtype).max, 1.0)


def amax_of(t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """max |t| in fp32 over all of t (one value, []), or over `dim` (kept); NaN where t has one, as torch.amax.
    One reduction kernel, no |t| materialised: the inf-norm is the amax."""
    return torch.linalg.vector_norm(t.detach(), ord=float("inf"), dim=dim, keepdim=dim is not None, dtype=torch.float32)


def amax_scale(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool) -> torch.Tensor:
    """fp32 scale mapping t's amax (over all of t, or over `dim`, kept) to the largest finite value of `dtype`
    (scale_for); `pow2`: rounded down to a power of two."""
    scale = scale_for(amax_of(t, dim), dtype)
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def scaled_cast(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t * scale in fp32, clamped to dtype's range and cast. The clamp keeps values the scale maps past the range (only
    a rounding of the scale can) finite: FP8 E4M3 has no inf, and a cast beyond it would give nan."""
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp_(-fmax, fmax).to(dtype)


def quantize(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 tensor, fp32 scale)."""
    scale = amax_scale(t, dtype, dim, pow2)
    return scaled_cast(t, scale, dtype), scale


def cast(t: torch.Tensor, dtype: torch.dtype, dim: int | None, pow2: bool, transposed: bool = False,
         amax: torch.Tensor | None = None) -> tuple:
    """The fp8_cast op's contract (engine/ops/fp8_cast/register.toml) in plain torch, its `baseline` version: a GEMM
    operand `t` (2-D, any strides: a transposed view for dgrad / wgrad) -> (FP8 copy, row-major contiguous; fp32
    scale) as `quantize` of its contiguous copy; `transposed` (one scale only) adds the row-major copy of the FP8
    transpose, (q, scale, q^T), for the backward GEMM that takes the operand transposed; `amax` (one scale only):
    t's amax, known already (the kernel that wrote t took it), so not reduced again."""
    check_cast(transposed, dim, pow2, amax)
    t = t.contiguous()
    if amax is None:
        q, scale = quantize(t, dtype, dim, pow2)
    else:
        scale = scale_for(amax, dtype)
        q = scaled_cast(t, scale, dtype)
    return (q, scale, q.t().contiguous()) if transposed else (q, scale)


def check_cast(transposed: bool, dim: int | None, pow2: bool = False, amax: torch.Tensor | None = None) -> None:
    """The cast contract's refusals (every fp8_cast version asks them): a transposed copy, or a known amax, with a
    scale per row; a known amax that is not one fp32 value, or with a power-of-two scale."""
    if transposed and dim is not None:
        raise ValueError("a transposed FP8 copy needs one scale for the tensor (dim None): a per-row scale does not "
                         "transpose")
    if amax is not None and (dim is not None or pow2 or amax.numel() != 1 or amax.dtype != torch.float32):
        raise ValueError(f"a known amax is one fp32 value for one unrounded scale (dim None, pow2 off); got "
                         f"{amax.dtype} {tuple(amax.shape)} with dim {dim}, pow2 {pow2}")


class Fp8Recipe(str):
    """An --fp8 recipe ("tensorwise" / "rowwise") that carries the fp8_cast version its GEMMs cast with, the
    fp8_wgrad version its weight gradients accumulate with, and whether its forward GEMMs accumulate fast
    (--fp8-fast-accum). It is the recipe string wherever one is compared or passed on (TPComm.fp8, the linears,
    gemm_fc1's `fp8`); only scaled_mm_nt reads `.cast`, only wgrad_add `.wgrad`, only linear_forward
    `.fast_accum`. A plain string recipe uses the baselines (`cast`, `scaled_wgrad_add` below) and full accumulation."""

    cast: Callable[..., tuple]
    wgrad: Callable[..., None]
    fast_accum: bool

    def __new__(cls, name: str, cast_fn: Callable[..., tuple], wgrad_fn: "Callable[..., None] | None" = None,
                fast_accum: bool = False) -> "Fp8Recipe":
        recipe = super().__new__(cls, name)
        recipe.cast = cast_fn
        recipe.wgrad = wgrad_fn or scaled_wgrad_add
        recipe.fast_accum = fast_accum
        return recipe

    def __reduce__(self) -> tuple:  # copy / deepcopy / pickle keep the versions (str's own would drop them)
        return (Fp8Recipe, (str(self), self.cast, self.wgrad, self.fast_accum))


@dataclass(frozen=True)
class Fp8Operand:
    """A GEMM operand already cast to FP8 with one scale (tensorwise): `q` (2-D, any strides) and its fp32 `scale`;
    `qt`, where the cast wrote it, the row-major copy of q's transpose; `inv`, where known, 1 / scale, which the
    GEMM's epilogue takes (fp8_copy forms it once for the operand's two GEMMs, a cached weight's for every
    micro-batch). `.t()` is the FP8 copy of the operand's transpose, bit for bit what casting t^T gives: the amax,
    so the scale, is the same, and the cast is elementwise. A GEMM takes it as is: row-major already where the cast
    wrote that layout (`qt`, or q stored transposed), else transposed in FP8 (1 byte an element: eager torch moves
    single bytes slowly, so the linears ask the cast for the layout their backward needs instead: docs/fp8.md)."""

    q: torch.Tensor
    scale: torch.Tensor
    qt: torch.Tensor | None = None
    inv: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def inverse(self) -> torch.Tensor:
        """1 / scale (the same bits as scale.reciprocal(), whichever formed it)."""
        return self.inv if self.inv is not None else self.scale.reciprocal()

    def t(self) -> "Fp8Operand":
        if self.qt is not None:
            return Fp8Operand(self.qt, self.scale, self.q, self.inv)
        return Fp8Operand(self.q.t(), self.scale, inv=self.inv)

    def transposed_only(self) -> "Fp8Operand":
        """The operand as backward keeps it when it needs only its transpose (x for wgrad, W for dgrad): the row-major
        copy of q^T, seen as q (a column-major view); q's own row-major copy is not held. Needs `qt`."""
        if self.qt is None:
            raise ValueError("transposed_only needs the transpose the cast writes (fp8_copy(..., transposed=True))")
        return Fp8Operand(self.qt.t(), self.scale, inv=self.inv)


def keeps_fp8(recipe: str) -> bool:
    """Whether a linear keeps its forward's FP8 copies of x and W for backward (dgrad: W^T, wgrad: x^T, transposed
    FP8 copies) and casts dy once for both backward GEMMs. Tensorwise only: one scale per tensor transposes with
    it (Fp8Operand). Rowwise scales each operand along K, so a per-row scale of x (forward) is not the per-row
    scale of x^T (wgrad), nor dy's per-token scale (dgrad) the per-output-feature one wgrad needs: rowwise casts
    every backward operand again from the saved bf16 tensors."""
    return recipe == "tensorwise"


def _cast_fn(recipe: str) -> Callable[..., tuple]:
    return recipe.cast if isinstance(recipe, Fp8Recipe) else cast


def fp8_copy(t: torch.Tensor, recipe: str, dtype: torch.dtype = E4M3, transposed: bool = False,
             amax: torch.Tensor | None = None) -> Fp8Operand:
    """t's tensorwise FP8 copy (keeps_fp8 recipes), cast by the recipe's fp8_cast version; `transposed`: the cast
    writes the transpose's row-major copy as well (`qt`), in the same pass; `amax`: t's, where known. With 1 / scale
    (`inv`): every keeps_fp8 operand feeds two GEMMs."""
    q, scale, *qt = _cast_fn(recipe)(t, dtype, None, False, transposed=transposed, amax=amax)
    return Fp8Operand(q, scale, qt[0] if qt else None, scale.reciprocal())


# --fp8-weight-cache: the weights' FP8 copies cast so far in this step (inside weight_copies_kept), else None
_WEIGHT_COPIES: "WeakIdKeyDictionary | None" = None


@contextmanager
def weight_copies_kept(on: bool) -> Iterator[None]:
    """Around a step's micro-batches (--fp8-weight-cache): inside, weight_copy casts each weight once and hands the
    same copies to the later micro-batches (the weights change only at the optimizer step, after this); dropped on
    exit. Off: weight_copy casts every time."""
    global _WEIGHT_COPIES
    if not on:
        yield
        return
    _WEIGHT_COPIES = WeakIdKeyDictionary()
    try:
        yield
    finally:
        _WEIGHT_COPIES = None


def kept_weight_copies() -> list[Fp8Operand]:
    """The copies weight_copies_kept holds now (engine/cuda_graph.py keeps the ones a graph captured alive)."""
    return [] if _WEIGHT_COPIES is None else list(_WEIGHT_COPIES.values())


def weight_copy(w: torch.Tensor, recipe: str) -> Fp8Operand:
    """A linear weight's tensorwise FP8 copies in both layouts (fp8_copy: the forward takes W, dgrad W^T), or the
    ones cast for it earlier in the step (weight_copies_kept), or (--fsdp-fp8-all-gather) the copy FSDP2 gathered
    with its transpose: the same bits each way."""
    if isinstance(w, Fp8Weight):
        return Fp8Operand(w.q, w.scale, w.q.t().contiguous(), w.scale.reciprocal())
    if _WEIGHT_COPIES is None:
        return fp8_copy(w, recipe, transposed=True)
    copies = _WEIGHT_COPIES.get(w)
    if copies is None:
        copies = _WEIGHT_COPIES[w] = fp8_copy(w, recipe, transposed=True)
    return copies


def grad_operand(g2: torch.Tensor, recipe: str, amax: torch.Tensor | None = None) -> "torch.Tensor | Fp8Operand":
    """dy [n, out] as both backward GEMMs take it: cast once (E5M2), in both layouts (dgrad takes dy, wgrad dy^T),
    where the recipe keeps FP8 copies (`amax`: dy's, where the kernel that wrote it took it), else dy."""
    return fp8_copy(g2, recipe, _grad_dtype(recipe), transposed=True, amax=amax) if keeps_fp8(recipe) else g2


def rows(t: "torch.Tensor | Fp8Operand") -> "torch.Tensor | Fp8Operand":
    """t as [tokens, features]: a tensor's leading dimensions flattened; an Fp8Operand is 2-D already."""
    return t if isinstance(t, Fp8Operand) else t.reshape(-1, t.shape[-1])


def save_operands(ctx, *operands) -> None:
    """ctx.save_for_backward of tensors and Fp8Operands (as their FP8 tensor, scale and 1 / scale): all through
    save_for_backward, so activation checkpointing's saved-tensor hooks see the FP8 copies too."""
    ctx.fp8_operands = tuple(isinstance(o, Fp8Operand) for o in operands)
    ctx.save_for_backward(*[t for o in operands
                            for t in ((o.q, o.scale, o.inverse()) if isinstance(o, Fp8Operand) else (o,))])


def saved_operands(ctx) -> list:
    """What save_operands saved, in its order."""
    saved = iter(ctx.saved_tensors)
    return [Fp8Operand(next(saved), next(saved), inv=next(saved)) if fp8 else next(saved) for fp8 in ctx.fp8_operands]


def _operand(t: "torch.Tensor | Fp8Operand", dtype: torch.dtype, dim: int | None, pow2: bool,
             fp8_cast: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Fp8Operand:
    """A GEMM operand as an Fp8Operand with q row-major: cast here, or an Fp8Operand's own (in the format asked for)."""
    if not isinstance(t, Fp8Operand):
        return Fp8Operand(*fp8_cast(t, dtype, dim, pow2))
    if dim is not None or t.q.dtype != dtype:
        raise ValueError(f"an Fp8Operand ({t.q.dtype}, one scale) was passed where the GEMM casts to {dtype} with "
                         f"scales along dim {dim}: only tensorwise operands are kept in FP8 (keeps_fp8)")
    return t if t.q.is_contiguous() else Fp8Operand(t.q.contiguous(), t.scale, inv=t.inv)


def scaled_mm_nt(a: "torch.Tensor | Fp8Operand", b: "torch.Tensor | Fp8Operand", recipe: str,
                 out_dtype: torch.dtype, a_dtype: torch.dtype = E4M3, fast_accum: bool = False) -> torch.Tensor:
    """a @ b^T (a [m, k], b [n, k], any strides) with both operands cast to FP8 by `recipe` (and its cast version),
    or given cast (Fp8Operand, tensorwise); `a_dtype`: the first operand's format (E5M2 for a tensorwise output
    gradient); `fast_accum`: accumulate at the tensor cores' precision, without the periodic fp32 promotion (Hopper:
    faster; the CPU emulation accumulates in fp32 either way)."""
    rowwise = recipe == "rowwise"
    dim = -1 if rowwise else None
    fp8_cast = _cast_fn(recipe)
    a8 = _operand(a, E4M3 if rowwise else a_dtype, dim, rowwise, fp8_cast)
    b8 = _operand(b, E4M3, dim, rowwise, fp8_cast)
    if rowwise:  # scale_a [m, 1], scale_b [1, n]; torch's rowwise kernel writes bf16 on CUDA
        out = torch.bfloat16 if a8.q.is_cuda else out_dtype
        y = torch._scaled_mm(a8.q, b8.q.t(), scale_a=a8.inverse(), scale_b=b8.inverse().t(), out_dtype=out,
                             use_fast_accum=fast_accum)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return _mm_tensorwise(a8, b8, out_dtype, fast_accum)


def _mm_tensorwise(a: Fp8Operand, b: Fp8Operand, out_dtype: torch.dtype, fast_accum: bool = False,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """(qa / sa) @ (qb / sb)^T of row-major FP8 operands with one scale each: the scales' reciprocals in the GEMM's
    epilogue (torch._scaled_mm); written into `out` (contiguous, out_dtype) where given."""
    return torch._scaled_mm(a.q, b.q.t(), scale_a=a.inverse(), scale_b=b.inverse(), out_dtype=out_dtype,
                            use_fast_accum=fast_accum, out=out)


def _grad_dtype(recipe: str) -> torch.dtype:
    return E5M2 if recipe == "tensorwise" else E4M3


def linear_forward(x2, w, recipe: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x2 [n, in] @ w^T -> [n, out] in x2's dtype (`out_dtype` where x2 is an Fp8Operand); fast accumulation where
    the recipe asks for it (torchao's recipes: the forward's output GEMM only, the gradients' GEMMs never)."""
    fast = recipe.fast_accum if isinstance(recipe, Fp8Recipe) else False
    return scaled_mm_nt(x2, w, recipe, out_dtype or x2.dtype, fast_accum=fast)


def linear_dgrad(g2, w, recipe: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """dy [n, out] @ w -> dx [n, in] in dy's dtype (`out_dtype` where dy is an Fp8Operand); w^T: the cast writes
    the transposed copy, or an Fp8Operand w is transposed in FP8."""
    return scaled_mm_nt(g2, w.t(), recipe, out_dtype or g2.dtype, _grad_dtype(recipe))


def linear_wgrad(g2, x2, recipe: str, out_dtype: torch.dtype) -> torch.Tensor:
    """dy^T [out, n] @ x [n, in] -> dW [out, in] in `out_dtype` (fp32 for a main_grad); tensors or Fp8Operands."""
    return scaled_mm_nt(g2.t(), x2.t(), recipe, out_dtype, _grad_dtype(recipe))


def scaled_wgrad_add(out: torch.Tensor, qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor) -> None:
    """out += (qa / sa) @ (qb / sb)^T in fp32: the fp8_wgrad op's contract (engine/ops/fp8_wgrad/register.toml) in
    plain torch, its `baseline` version (_scaled_mm cannot accumulate: the product is written, then added)."""
    out.add_(_mm_tensorwise(Fp8Operand(qa, sa), Fp8Operand(qb, sb), out.dtype))


def check_wgrad(out: torch.Tensor, qa: torch.Tensor, qb: torch.Tensor, version: str) -> None:
    """The fp8_wgrad contract's inputs, as the GEMM-epilogue versions (`version`) take them: FP8 operands qa [m, k]
    and qb [n, k], both row-major with k a multiple of 16, into a contiguous fp32 out [m, n], all on CUDA; one
    ValueError naming every problem and the fix."""
    (m, k), (n, kb) = qa.shape, qb.shape
    problems = []
    if qa.dtype not in (E4M3, E5M2) or qb.dtype not in (E4M3, E5M2):
        problems.append(f"operands {qa.dtype} and {qb.dtype}, not FP8")
    if out.dtype != torch.float32 or tuple(out.shape) != (m, n) or not out.is_contiguous():
        problems.append(f"out {out.dtype} {tuple(out.shape)} (contiguous: {out.is_contiguous()}), not fp32 [{m}, {n}]")
    if kb != k or k % 16 or qa.stride(-1) != 1 or qb.stride(-1) != 1:
        problems.append(f"qa {tuple(qa.shape)} strides {qa.stride()} and qb {tuple(qb.shape)} strides {qb.stride()}: "
                        "both row-major with one k, a multiple of 16")
    if not (out.is_cuda and qa.is_cuda and qb.is_cuda):
        problems.append("tensors not on CUDA")
    if problems:
        raise ValueError(f"fp8_wgrad ({version}) cannot take these inputs: {'; '.join(problems)}: use "
                         f"--op-fp8-wgrad baseline")


def wgrad_add(out: torch.Tensor, g2, x2, recipe: str, write: bool = False) -> None:
    """out (a linear's fp32 gradient accumulator) += dy^T x in FP8 by `recipe` (g2 = dy [n, out], x2 [n, in]: tensors
    or Fp8Operands), or, `write` (a step's first contribution: engine/distributed/wgrad.py MainGrad), out = dy^T x.
    Tensorwise adds through the recipe's fp8_wgrad version on the row-major FP8 copies of dy^T and x^T (the layouts
    the linears keep) and writes with the GEMM's own output (out=): 12 bytes a parameter less than a product's fp32
    copy and an add, the same bits as 0 + product. Rowwise (a scale per row along K: not the op's one scale each)
    forms the product, then copies or adds it."""
    if not keeps_fp8(recipe):
        product = linear_wgrad(g2, x2, recipe, out.dtype)
        if write:
            out.copy_(product)
        else:
            out.add_(product)
        return
    fp8_cast = _cast_fn(recipe)
    a8 = _operand(g2.t(), _grad_dtype(recipe), None, False, fp8_cast)
    b8 = _operand(x2.t(), E4M3, None, False, fp8_cast)
    if write:
        _mm_tensorwise(a8, b8, out.dtype, out=out)
        return
    (recipe.wgrad if isinstance(recipe, Fp8Recipe) else scaled_wgrad_add)(out, a8.q, a8.scale, b8.q, b8.scale)


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
