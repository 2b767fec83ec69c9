"""The fp8_wgrad op (engine/ops/fp8_wgrad/register.toml): a linear's tensorwise FP8 weight gradient added into its
fp32 accumulator. CPU: resolution and the layers' recipe, the baseline against an fp64 reference of the quantised
operands, and the linears' weight-gradient path through it bit for bit the path it replaced (_scaled_mm, then add).
GPU (`-m gpu`): the quack and cublaslt versions against the baseline at the 8B linears' shapes and run to run."""

import copy

import pytest
import torch

from engine.config import EngineConfig
from engine.distributed.fp8 import E4M3, E5M2, Fp8Recipe, cast, fp8_copy, linear_wgrad, scaled_wgrad_add, wgrad_add
from engine.errors import ConfigError
from engine.ops import resolve_ops
from engine.ops.dispatch import load_op, resolve_version


def _operands(m: int, n: int, k: int, seed: int = 0, device: str = "cpu"):
    """A linear's weight-gradient operands in bf16: dy [k, m] and x [k, n] over k tokens."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dy = (torch.randn(k, m, generator=g) * 1e-3).to(device, torch.bfloat16)
    x = torch.randn(k, n, generator=g).to(device, torch.bfloat16)
    return dy, x


def test_fp8_resolves_the_wgrad_version_and_the_layers_recipe_carries_it():
    from engine.distributed import ParallelState
    from engine.model.layers import tp_comm
    from engine.ops.fp8_wgrad import baseline

    ops = resolve_ops(EngineConfig(fp8="tensorwise"), "cpu")
    assert ops.versions["fp8_wgrad"] == "baseline" and ops.fp8_wgrad is baseline.wgrad_add is scaled_wgrad_add
    assert resolve_version("fp8_wgrad", "", "cuda", fp8=True) == "cublaslt"  # the CUDA default (docs/fp8.md)
    from engine.ops.fp8_wgrad import cublaslt
    assert load_op("fp8_wgrad", "cublaslt") is cublaslt.wgrad_add  # importable anywhere: the library opens at a call
    assert "fp8_wgrad" not in resolve_ops(EngineConfig(), "cpu").versions  # no --fp8: not resolved
    tp = tp_comm(EngineConfig(fp8="tensorwise"), ParallelState.single(torch.device("cpu")), ops)
    assert isinstance(tp.fp8, Fp8Recipe) and tp.fp8.wgrad is scaled_wgrad_add
    assert copy.deepcopy(tp.fp8).wgrad is scaled_wgrad_add  # a copied recipe keeps its versions
    with pytest.raises(ConfigError, match=r"'quack'.*(cuda|CUDA)"):  # CuTeDSL: CUDA only, refused on CPU by name
        resolve_ops(EngineConfig(fp8="tensorwise", op_fp8_wgrad="quack"), "cpu")
    with pytest.raises(ConfigError, match=r"'cublaslt'.*(cuda|CUDA)"):
        resolve_ops(EngineConfig(fp8="tensorwise", op_fp8_wgrad="cublaslt"), "cpu")
    with pytest.raises(ConfigError, match=r"'fused'.*not a version of op 'fp8_wgrad'.*baseline, quack, cublaslt"):
        resolve_ops(EngineConfig(fp8="tensorwise", op_fp8_wgrad="fused"), "cpu")


def test_the_baseline_adds_the_product_of_the_dequantised_operands():
    """out += (qa / sa) @ (qb / sb)^T: against the same product in fp64 of the dequantised FP8 values, within fp32
    rounding (out ~ 1 plus a product ~ 1e-2, k = 256 terms: a few fp32 ulps of out)."""
    dy, x = _operands(48, 32, 256)
    out = torch.randn(48, 32, dtype=torch.float32)
    start = out.clone()
    qa, sa = cast(dy.t(), E5M2, None, False)
    qb, sb = cast(x.t(), E4M3, None, False)
    scaled_wgrad_add(out, qa, sa, qb, sb)
    ref = start.double() + (qa.double() / sa.double()) @ (qb.double() / sb.double()).t()
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kept", [True, False], ids=["fp8-copies", "bf16-tensors"])
def test_wgrad_add_is_bit_for_bit_the_product_then_the_add(kept):
    """The linears' weight-gradient path (engine/distributed/wgrad.py MainGrad.weight_grad) through the op equals
    what it replaced, bit for bit, whether dy and x come as their kept FP8 copies or as bf16 tensors cast here."""
    dy, x = _operands(64, 48, 128, seed=1)
    g2 = fp8_copy(dy, "tensorwise", E5M2, transposed=True) if kept else dy
    x2 = fp8_copy(x, "tensorwise", transposed=True).transposed_only() if kept else x
    out = torch.randn(64, 48)
    before = out.clone()
    wgrad_add(out, g2, x2, Fp8Recipe("tensorwise", cast, scaled_wgrad_add))
    assert torch.equal(out, before + linear_wgrad(g2, x2, "tensorwise", torch.float32))
    rowwise = torch.randn(64, 48)
    expected = rowwise + linear_wgrad(dy, x, "rowwise", torch.float32)
    wgrad_add(rowwise, dy, x, "rowwise")  # rowwise: the product, then the add (no fp8_wgrad version involved)
    assert torch.equal(rowwise, expected)


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def test_cublaslt_fails_fast_without_torchs_cublaslt_and_refuses_cpu_operands():
    """The cublaslt version loads the libcublasLt torch's CUDA build loaded, or raises naming the fix (a CPU build
    loads none); CPU tensors are refused by the contract's check before any library is touched."""
    from engine.errors import KernelLoadError
    from engine.ops.fp8_wgrad import cublaslt

    dy, x = _operands(32, 16, 64)
    qa, sa = cast(dy.t(), E5M2, None, False)
    qb, sb = cast(x.t(), E4M3, None, False)
    with pytest.raises(ValueError, match=r"fp8_wgrad \(cublaslt\).*not on CUDA.*--op-fp8-wgrad baseline"):
        cublaslt.wgrad_add(torch.zeros(32, 16), qa, sa, qb, sb)
    if not torch.cuda.is_available():
        with pytest.raises(KernelLoadError, match=r"'fp8_wgrad' version 'cublaslt'.*libcublasLt.*--op-fp8-wgrad baseline"):
            cublaslt._library()


def _version(name: str):
    if name == "quack":
        from engine.ops.fp8_wgrad.quack_add import wgrad_add
    else:
        from engine.ops.fp8_wgrad.cublaslt import wgrad_add
    return wgrad_add


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs an SM90 GPU")
@pytest.mark.parametrize("version", ["quack", "cublaslt"])
@pytest.mark.parametrize("m, n", [(6144, 4096), (4096, 4096), (32768, 4096), (4096, 16384), (3072, 4096)],
                         ids=["qkv", "o", "fc1", "fc2", "qkv-tp2"])
def test_epilogue_add_equals_the_baseline_to_fp32_rounding_and_repeats_bit_for_bit(version, m, n):
    """The 8B linears' weight gradients over 8192 tokens (mbs 2 x 4096), added to a filled accumulator: the epilogue
    versions round once (alpha * acc + out), the baseline twice (the scaled product, then the add), so they differ by
    fp32 ulps of the result; the product's own accumulation order may differ too (bounded like any fp32 GEMM of k =
    8192 terms: 1e-5 of the product's scale). Two calls give the same bits."""
    if version == "quack":
        pytest.importorskip("quack.gemm_interface")
    add = _version(version)
    dy, x = _operands(m, n, 8192, seed=2, device="cuda")
    qa, sa = cast(dy.t(), E5M2, None, False)
    qb, sb = cast(x.t(), E4M3, None, False)
    start = torch.randn(m, n, device="cuda") * 1e-2
    base, fast, again = start.clone(), start.clone(), start.clone()
    scaled_wgrad_add(base, qa, sa, qb, sb)
    add(fast, qa, sa, qb, sb)
    add(again, qa, sa, qb, sb)
    assert torch.equal(fast, again)
    scale = (base - start).abs().max().item()
    assert (fast - base).abs().max().item() <= 1e-5 * scale + 1e-7, ((fast - base).abs().max().item(), scale)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs an SM90 GPU")
def test_cublaslt_adds_into_a_view_of_a_flat_buffer_and_under_a_cuda_graph():
    """As the engine calls it: out is a parameter's view into the flat fp32 gradient buffer (an offset, not a fresh
    allocation), and a captured call replays the same add. The graph's replay equals the eager call bit for bit."""
    add = _version("cublaslt")
    dy, x = _operands(1024, 512, 4096, seed=3, device="cuda")
    qa, sa = cast(dy.t(), E5M2, None, False)
    qb, sb = cast(x.t(), E4M3, None, False)
    flat = torch.randn(64 + 1024 * 512, device="cuda")  # an offset of 64 floats: 256 bytes
    view = flat[64:].view(1024, 512)
    start = view.clone()
    add(view, qa, sa, qb, sb)
    eager = view.clone()
    view.copy_(start)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            add(view, qa, sa, qb, sb)
    torch.cuda.current_stream().wait_stream(stream)
    view.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(view, eager)
    base = start.clone()
    scaled_wgrad_add(base, qa, sa, qb, sb)
    assert (eager - base).abs().max().item() <= 1e-5 * (base - start).abs().max().item() + 1e-7


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs an SM90 GPU")
@pytest.mark.parametrize("version", ["quack", "cublaslt"])
def test_epilogue_versions_refuse_what_their_kernel_cannot_take(version):
    if version == "quack":
        pytest.importorskip("quack.gemm_interface")
    add = _version(version)
    dy, x = _operands(64, 48, 40, device="cuda")  # k = 40: not a multiple of 16
    qa, sa = cast(dy.t(), E5M2, None, False)
    qb, sb = cast(x.t(), E4M3, None, False)
    with pytest.raises(ValueError, match="multiple of 16.*--op-fp8-wgrad baseline"):
        add(torch.zeros(64, 48, device="cuda"), qa, sa, qb, sb)
