"""--fp8-fast-accum (engine/distributed/fp8.py linear_forward): the forward GEMMs ask torch._scaled_mm for fast
accumulation and the gradients' GEMMs never, as torchao's float8 recipes configure them (its Float8LinearConfig:
gemm_config_output use_fast_accum=True, grad_input and grad_weight False).

What is checked is what every FP8 GEMM asks for, read at the dispatcher (a TorchDispatchMode sees each
aten._scaled_mm call with its arguments): the CPU emulation accumulates in fp32 whatever the flag says, so the
numbers cannot show it here; the speed and the numerics of fast accumulation are the GPU's (docs/fp8.md).
"""

import copy
import pickle

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.config import build_config, resolve
from engine.distributed.fp8 import Fp8Recipe, cast
from engine.distributed.state import ParallelState
from engine.distributed.wgrad import MainGrad, attach_main_grad, fused_linear
from engine.errors import ConfigError
from engine.model.transformer import build_model
from engine.ops.dispatch import resolve_ops

CPU = torch.device("cpu")


class ScaledMmCalls(TorchDispatchMode):
    """Records use_fast_accum of every aten._scaled_mm call (positional index 7 in its schema, or by name)."""

    def __init__(self):
        super().__init__()
        self.fast: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.aten._scaled_mm:
            self.fast.append(bool(kwargs.get("use_fast_accum", args[7] if len(args) > 7 else False)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "main_grad"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("fast", [False, True], ids=["full", "fast"])
def test_the_forward_gemm_accumulates_fast_where_asked_and_the_gradients_never(recipe, fast, fused):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 48, generator=g).requires_grad_()
    w = (torch.randn(32, 48, generator=g) * 0.05).requires_grad_()
    if fused:
        attach_main_grad(w, MainGrad(torch.zeros_like(w)))
    forward, backward = ScaledMmCalls(), ScaledMmCalls()
    with forward:
        y = fused_linear(x, w, Fp8Recipe(recipe, cast, fast_accum=fast))
    with backward:
        y.backward(torch.randn(y.shape, generator=g))
    assert forward.fast == [fast]
    assert backward.fast == [False, False]  # dgrad and wgrad


def test_every_forward_gemm_of_the_model_takes_the_flag():
    """The flag reaches the model's linears (QKV, O, FC1, FC2 of each layer, through tp_comm's recipe); the LM head
    stays a bf16 GEMM (no _scaled_mm)."""
    for fast in (False, True):
        cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "compute_dtype": "fp32", "seq_length": 32,
                                    "fp8": "tensorwise", "fp8_fast_accum": fast}))
        torch.manual_seed(0)
        model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
        tokens = torch.randint(0, cfg.vocab_size, (2, 32))
        forward, backward = ScaledMmCalls(), ScaledMmCalls()
        with forward:
            loss = model(tokens, tokens)
        with backward:
            loss.backward()
        assert forward.fast == [fast] * 4 * cfg.num_layers
        assert backward.fast == [False] * 8 * cfg.num_layers


def test_the_recipe_keeps_the_flag_through_copies_and_the_flag_needs_fp8():
    recipe = Fp8Recipe("tensorwise", cast, fast_accum=True)
    for twin in (copy.copy(recipe), copy.deepcopy(recipe), pickle.loads(pickle.dumps(recipe))):
        assert twin == "tensorwise" and twin.fast_accum and twin.cast is cast
    assert not Fp8Recipe("rowwise", cast).fast_accum
    with pytest.raises(ConfigError, match="--fp8-fast-accum=True sets how FP8 GEMMs accumulate.*add --fp8 tensorwise"):
        resolve(build_config({"fp8_fast_accum": True}))
    assert resolve(build_config({"fp8": "rowwise", "fp8_fast_accum": True})).fp8_fast_accum


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_on_the_gpu_fast_accumulation_moves_the_output_alone_and_little(recipe):
    """On Hopper the flag reaches the kernel: at K = 4096 (the 8B hidden size) the forward's output differs from full
    accumulation's, by little: both against the fp32 product of the same FP8 operands, fast accumulation within 1e-2
    relative (bf16 output rounding alone is 2^-9; fast accumulation keeps a narrower accumulator over K, DeepSeek-V3
    measured ~2 % worst case at K = 4096 on H800 without promotion, so 1e-2 in L2 over a random matrix is loose); the
    gradients, computed by the same full-accumulation GEMMs from the same saved FP8 copies, bit for bit."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU of compute capability 8.9+")
    from engine.distributed.fp8 import reference_linear_fp8

    g = torch.Generator().manual_seed(11)
    x0 = torch.randn(2048, 4096, generator=g).cuda().bfloat16()
    w0 = (torch.randn(1024, 4096, generator=g) * 0.02).cuda().bfloat16()
    dy = torch.randn(2048, 1024, generator=g).cuda().bfloat16()
    runs = {}
    for fast in (False, True):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = fused_linear(x, w, Fp8Recipe(recipe, cast, fast_accum=fast))
        y.backward(dy)
        runs[fast] = (y.detach(), x.grad, w.grad)
    (y_full, dx_full, dw_full), (y_fast, dx_fast, dw_fast) = runs[False], runs[True]
    assert not torch.equal(y_fast, y_full)
    ref = reference_linear_fp8(x0, w0, dy, recipe)[0]
    rel = lambda a: ((a.float() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(y_full) < 1e-2 and rel(y_fast) < 1e-2, (rel(y_full), rel(y_fast))
    assert torch.equal(dx_fast, dx_full) and torch.equal(dw_fast, dw_full)
