"""Gradient-accumulation fusion (engine/distributed/wgrad.py, --grad-accum-fusion): weight gradients added
straight into the fp32 gradient buffer instead of a bf16 gradient plus an add.

References are independent: fp64 matmuls and index sums of the same operands, and torch's own autograd
through F.linear / F.embedding. Tolerances:
- fp32 accumulation of bf16 products against fp64: 1e-6 relative (fp32 rounding of sums of exact products,
  K = 96 terms per element); the unfused bf16 gradient is >= 2e-4 away (one bf16 rounding, 2^-9 = 2e-3 per
  element, partly cancelling in the norm), so the test tells the two paths apart;
- fp32 models, fused against unfused: 1e-6 (the same products summed by another kernel).
The parallel paths (column-parallel QKV, the MLP region's FC2, the vocab-parallel embedding) are checked at
TP 2 in tests/parallel/test_tp_dp_equivalence.py; the GPU kernels (cuBLAS bf16 x bf16 -> fp32 with beta 1,
CUDA's sorted index_put_) by the gpu tests here.
"""

import pytest
import torch
import torch.nn.functional as F

from engine.config import build_config, resolve
from engine.distributed import MainGrad, ParallelState, attach_main_grad, fused_embedding, fused_linear
from engine.distributed import wgrad
from engine.distributed.wgrad import add_rows_by_id, main_grad_of
from engine.model import build_model
from engine.ops import resolve_ops
from engine.optim import FlatBuffers

CPU = torch.device("cpu")


@pytest.fixture
def torch_deterministic():
    """torch's deterministic mode on (as --deterministic sets it), as the test found it afterwards: an op
    torch has no deterministic kernel for raises instead of running."""
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(saved)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _linear_case(device: torch.device, dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 24, 48, generator=g).to(device, dtype)  # [b, s, in]: the model passes 3-D activations
    w = torch.randn(32, 48, generator=g).to(device, dtype)
    dys = [torch.randn(4, 24, 32, generator=g).to(device, dtype) for _ in range(3)]  # three micro-batches
    return x, w, dys


def _fused_wgrad(x, w, dys) -> tuple[torch.Tensor, list[torch.Tensor]]:
    w = w.clone().requires_grad_()
    main = MainGrad(torch.zeros(w.shape, dtype=torch.float32, device=w.device))
    attach_main_grad(w, main)
    dxs = []
    for dy in dys:
        xi = x.clone().requires_grad_()
        fused_linear(xi, w).backward(dy)
        assert main.take(), "the fused backward did not fill the buffer"
        w.grad = None  # what FlatBuffers' hook does with the placeholder
        dxs.append(xi.grad)
    return main.grad, dxs


def _fp64_wgrad(x, dys) -> torch.Tensor:
    return sum(dy.double().reshape(-1, dy.shape[-1]).t() @ x.double().reshape(-1, x.shape[-1]) for dy in dys)


def test_fused_linear_accumulates_in_fp32_where_the_unfused_gradient_is_rounded() -> None:
    x, w, dys = _linear_case(CPU)
    fused, dxs = _fused_wgrad(x, w, dys)
    want = _fp64_wgrad(x, dys)
    assert rel(fused, want) < 1e-6
    unfused = torch.zeros(w.shape)
    wu = w.clone().requires_grad_()
    for dy, dx in zip(dys, dxs):
        xi = x.clone().requires_grad_()
        F.linear(xi, wu).backward(dy)
        unfused += wu.grad.float()  # the bf16 gradient FlatBuffers adds unfused
        wu.grad = None
        assert torch.equal(xi.grad, dx)  # the input gradient is autograd's own
    assert rel(unfused, want) > 2e-4


def test_fused_embedding_sums_repeated_rows_in_fp32() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(50, 16, generator=g).to(torch.bfloat16).requires_grad_()
    main = MainGrad(torch.zeros(50, 16))
    attach_main_grad(w, main)
    ids = torch.randint(0, 10, (6, 20), generator=g)  # many repeats of few rows
    dy = torch.randn(6, 20, 16, generator=g).to(torch.bfloat16)
    out = fused_embedding(ids, w)
    assert torch.equal(out, F.embedding(ids, w.detach()))
    out.backward(dy)
    assert main.take()
    want = torch.zeros(50, 16, dtype=torch.float64).index_add_(0, ids.reshape(-1), dy.double().reshape(-1, 16))
    assert rel(main.grad, want) < 1e-6
    assert main.grad[10:].abs().sum() == 0  # rows never looked up get nothing


@pytest.mark.parametrize("n, ids, frequent", [(1, 5, 0), (9, 3, 0), (512, 40, 300), (2048, 2000, 0), (512, 1, 0)],
                         ids=["one-row", "few-ids", "a-frequent-token", "mostly-distinct", "one-id-only"])
def test_rows_summed_by_id_match_fp64_and_repeat_bitwise(n, ids, frequent, torch_deterministic) -> None:
    """add_rows_by_id (the CUDA path of the embedding's backward, device-agnostic) against an fp64 index_add_:
    1e-6 relative (fp32 sums of up to n rows). With one id repeated hundreds of times (EOS, a space), with
    fewer runs than rows (the unused sums are exact zeros added to real ids), under torch's deterministic mode,
    and twice bitwise."""
    g = torch.Generator().manual_seed(n)
    index = torch.randint(0, ids, (n,), generator=g)
    index[torch.randperm(n, generator=g)[:frequent]] = ids - 1
    rows = torch.randn(n, 16, generator=g)
    start = torch.randn(ids + 3, 16, generator=g)
    want = start.double().index_add(0, index, rows.double())
    got = []
    for _ in range(2):
        grad = start.clone()
        add_rows_by_id(grad, index, rows)
        got.append(grad)
    assert torch.equal(got[0], got[1])
    assert rel(got[0], want) < 1e-6
    assert torch.equal(got[0][ids:], start[ids:])  # rows never looked up are untouched


@pytest.mark.parametrize("ids, outside", [(1, 0), (40, 0), (3000, 0.97)], ids=["one-id", "few-ids", "a-tp-shard"])
def test_rows_summed_by_id_add_to_no_row_more_than_twice(ids, outside) -> None:
    """The one accumulating index_put_ of add_rows_by_id (read at the dispatcher) adds to no row more than twice,
    however few distinct ids: a run of equal indices there is summed serially in one warp. The TP case is a
    vocab-parallel shard whose tokens are nearly all another rank's (masked to row 0 by VocabEmbedding): 5.6 ms a
    micro-batch on an H200 when the unused zero sums went to the few real ids (one row got ~8,000 additions)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Puts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.indices = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.index_put_:
                self.indices.append(args[1][0].clone())
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(ids)
    n, vocab = 4096, 8192  # token rows, rows of the (shard's) table
    index = torch.randint(0, ids, (n,), generator=g)
    index[torch.rand(n, generator=g) < outside] = 0
    rows = torch.randn(n, 8, generator=g)
    grad = torch.zeros(vocab, 8)
    with Puts() as puts:
        add_rows_by_id(grad, index, rows)
    assert len(puts.indices) == 1
    assert torch.bincount(puts.indices[0], minlength=vocab).max() <= 2
    # fp32 sums of up to 4,096 rows: a few 1e-6 relative (sqrt(n) * 2^-24 ~ 4e-6)
    assert rel(grad, torch.zeros(vocab, 8, dtype=torch.float64).index_add_(0, index, rows.double())) < 1e-5


def test_without_a_main_grad_the_plain_ops_run() -> None:
    x, w, dys = _linear_case(CPU, torch.float32)
    w = w.requires_grad_()
    fused_linear(x, w).backward(dys[0])
    assert w.grad is not None and rel(w.grad, _fp64_wgrad(x, dys[:1])) < 1e-6


def test_the_main_grad_is_held_by_wgrad_not_stamped_on_the_parameter() -> None:
    """One module writes the parameter -> MainGrad mapping and reads it back (issue 33 section 2): the parameter gets
    no attribute, an equal parameter is another key, and a dropped parameter leaves the mapping."""
    w = torch.nn.Parameter(torch.zeros(4, 4))
    before = set(vars(w))
    main = MainGrad(torch.zeros(4, 4))
    attach_main_grad(w, main)
    assert main_grad_of(w) is main and set(vars(w)) == before
    assert main_grad_of(torch.nn.Parameter(torch.zeros(4, 4))) is None
    held = len(wgrad._MAIN_GRADS)
    del w
    assert len(wgrad._MAIN_GRADS) == held - 1


def _fc1_grads(version: str, device: torch.device, dtype: torch.dtype, fused: bool):
    """gemm_fc1's weight gradient over three micro-batches: from its MainGrad (fused) or autograd (summed in fp32)."""
    from engine.ops.dispatch import load_op

    fc1 = load_op("gemm_fc1", version)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 64, 128, generator=g).to(device, dtype)
    w = (torch.randn(2 * 96, 128, generator=g) * 128 ** -0.5).to(device, dtype).requires_grad_()
    main = MainGrad(torch.zeros(w.shape, dtype=torch.float32, device=device)) if fused else None
    total = torch.zeros(w.shape, dtype=torch.float32, device=device)
    for _ in range(3):
        dy = torch.randn(2, 64, 96, generator=g).to(device, dtype)
        fc1(x, w, main_grad=main).backward(dy)
        if fused:
            assert main.take(), f"gemm_fc1 ({version}) did not hand its weight gradient to the main_grad"
        else:
            total += w.grad.float()
        w.grad = None
    return main.grad if fused else total, (x, w)


def _fc1_fp64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    torch.randn(2, 64, 128, generator=g), torch.randn(2 * 96, 128, generator=g)  # the draws _fc1_grads made first
    w64 = w.detach().double().cpu().requires_grad_()
    for _ in range(3):
        dy = torch.randn(2, 64, 96, generator=g).to(x.dtype).double()
        gate, up = F.linear(x.double().cpu(), w64).chunk(2, dim=-1)
        (F.silu(gate) * up).backward(dy)
    return w64.grad


def test_gemm_fc1_adds_its_weight_gradient_into_the_main_grad() -> None:
    """The op contract's main_grad (engine/ops/gemm_fc1/register.toml): the baseline adds dW in fp32 and gives
    autograd a placeholder. fp32: fused and unfused are the same products (1e-6); bf16 against fp64: 1e-2 (the
    gate's backward runs in bf16 in both paths), and fused no less accurate than unfused."""
    fused, _ = _fc1_grads("baseline", CPU, torch.float32, True)
    unfused, _ = _fc1_grads("baseline", CPU, torch.float32, False)
    assert rel(fused, unfused) < 1e-6
    fused, (x, w) = _fc1_grads("baseline", CPU, torch.bfloat16, True)
    unfused, _ = _fc1_grads("baseline", CPU, torch.bfloat16, False)
    want = _fc1_fp64(x, w)
    assert rel(fused, want) < 1e-2 and rel(fused, want) <= rel(unfused, want) * 1.05


_OUT = {"n": 1000, "d": 128, "v_local": 512, "vocab_size": 500, "chunk": 384}  # 3 chunks, the last one short


def _output_module(version: str):
    import importlib

    return importlib.import_module({"baseline": "engine.ops.gemm_output.baseline",
                                    "quack": "engine.ops.gemm_output.quack_ce"}[version])


def _output_batches(device: torch.device, dtype: torch.dtype):
    """h, w and three micro-batches' labels (a tenth ignored); the loss scale is 1 / all valid labels, as the
    engine divides every micro-batch's loss sum by the step's valid-token count."""
    g = torch.Generator().manual_seed(6)
    h = torch.randn(_OUT["n"], _OUT["d"], generator=g).to(device, dtype)
    w = (torch.randn(_OUT["v_local"], _OUT["d"], generator=g) * _OUT["d"] ** -0.5).to(device, dtype)
    labels = [torch.randint(0, _OUT["vocab_size"], (_OUT["n"],), generator=g) for _ in range(3)]
    for y in labels:
        y[torch.rand(_OUT["n"], generator=g) < 0.1] = -100
    scale = 1.0 / sum(int((y != -100).sum()) for y in labels)
    return h, w, [y.to(device) for y in labels], scale


def _output_grads(version: str, device: torch.device, dtype: torch.dtype, fused: bool) -> torch.Tensor:
    """The LM head's weight gradient over three micro-batches: from its MainGrad (fused) or autograd (summed in
    fp32), through gemm_output_chunked so that each micro-batch crosses chunk boundaries."""
    op = _output_module(version).gemm_output_chunked
    h, w, labels, scale = _output_batches(device, dtype)
    w = w.requires_grad_()
    main = MainGrad(torch.zeros(w.shape, dtype=torch.float32, device=device)) if fused else None
    total = torch.zeros(w.shape, dtype=torch.float32, device=device)
    for y in labels:
        loss = op(h.clone().requires_grad_(), w, y, vocab_start=0, vocab_size=_OUT["vocab_size"],
                  chunk_tokens=_OUT["chunk"], main_grad=main)
        (loss * scale).backward()
        if fused:
            assert main.take(), f"gemm_output ({version}) did not hand its weight gradient to the main_grad"
        else:
            total += w.grad.float()
        w.grad = None
    return main.grad if fused else total


def _output_fp64(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    h, w, labels, scale = _output_batches(device, dtype)
    h64, w64 = h.cpu().double(), w.cpu().double().requires_grad_()
    for y in labels:
        logits = (h64 @ w64.t())[:, : _OUT["vocab_size"]]
        (F.cross_entropy(logits, y.cpu(), ignore_index=-100, reduction="sum") * scale).backward()
    return w64.grad


def test_gemm_output_adds_its_weight_gradient_into_the_main_grad() -> None:
    """The op contract's main_grad (engine/ops/gemm_output/register.toml): the baseline adds each chunk's scaled
    dW in fp32 and gives autograd a placeholder. fp32: fused and unfused are the same products (1e-6) and match
    fp64 (1e-6: fp32 softmax and sums); bf16 against fp64: 1e-2 (d loss / d logits rounded to bf16 in both
    paths), and fused no less accurate than unfused."""
    want = _output_fp64(CPU, torch.float32)
    fused, unfused = (_output_grads("baseline", CPU, torch.float32, f) for f in (True, False))
    assert rel(fused, unfused) < 1e-6 and rel(fused, want) < 1e-6
    want = _output_fp64(CPU, torch.bfloat16)
    fused, unfused = (_output_grads("baseline", CPU, torch.bfloat16, f) for f in (True, False))
    assert rel(fused, want) < 1e-2 and rel(fused, want) <= rel(unfused, want) * 1.05


def _model_grads(fuse: bool) -> dict[str, torch.Tensor]:
    cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "compute_dtype": "fp32", "seq_length": 32}))
    torch.manual_seed(0)
    model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    buffers = FlatBuffers(model, fuse_wgrad=fuse)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):  # three micro-batches accumulate
        tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length + 1), generator=g)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    return {e.name: buffers.grad_view(e).clone() for e in buffers.entries}


def test_a_model_trains_on_the_same_gradients_fused_or_not() -> None:
    fused, unfused = _model_grads(True), _model_grads(False)
    for name in ("embed.weight", "layers.0.attn.qkv", "layers.0.attn.o", "layers.1.mlp.fc2", "layers.1.mlp.fc1",
                 "lm_head"):
        assert fused[name].abs().sum() > 0, name
        assert rel(fused[name], unfused[name]) < 1e-6, name


def _stale(shape, device=CPU) -> MainGrad:
    """A MainGrad as FlatBuffers.zero_grads leaves it lazily: its view still holds the last step's values (NaN here,
    so that any sum that read them would show it)."""
    main = MainGrad(torch.full(shape, float("nan"), device=device))
    main.reset(zeroed=False)
    return main


def _adding(shape, device=CPU) -> MainGrad:
    """A MainGrad over zeros whose every contribution adds (tests/engine/always_add.py): the reference."""
    main = MainGrad(torch.zeros(shape, device=device))
    main._fresh = False
    return main


@pytest.mark.parametrize("fp8", ["off", "tensorwise", "rowwise"])
def test_a_steps_first_weight_gradient_writes_over_the_last_steps_values(fp8) -> None:
    """The first micro-batch's weight-gradient GEMM writes the view (its product replaces what the last step left),
    later ones add: bit for bit the same GEMMs added onto zeros (CPU rounds a written product as one added to 0)."""
    x, w, dys = _linear_case(CPU, torch.float32 if fp8 == "off" else torch.bfloat16)
    grads = []
    for main in (_stale(w.shape), _adding(w.shape)):
        wr = w.clone().requires_grad_()
        attach_main_grad(wr, main)
        for dy in dys:
            fused_linear(x.clone().requires_grad_(), wr, fp8).backward(dy)
            assert main.take()
        grads.append(main.grad)
    assert torch.isfinite(grads[0]).all() and torch.equal(grads[0], grads[1])


def test_a_steps_first_row_sums_and_unfused_gradients_write_over_the_last_steps_values() -> None:
    """The embedding's rows (repeated ids: the view is cleared, then added to) and an unfused gradient (FlatBuffers'
    hook: copied), first of a step over the last step's values, then added: as onto zeros, bit for bit."""
    g = torch.Generator().manual_seed(5)
    ids = [torch.randint(0, 10, (3, 8), generator=g) for _ in range(2)]
    dys = [torch.randn(3, 8, 16, generator=g) for _ in range(2)]
    sums = []
    for main in (_stale((50, 16)), _adding((50, 16))):
        wt = torch.zeros(50, 16, requires_grad=True)
        attach_main_grad(wt, main)
        for i, dy in zip(ids, dys):
            fused_embedding(i, wt).backward(dy)
        sums.append(main.grad)
    assert torch.equal(sums[0], sums[1]) and sums[0][10:].abs().sum() == 0  # rows never looked up: zeros, not NaN
    unfused = [torch.randn(4, 4, generator=g).bfloat16() for _ in range(2)]
    added = []
    for main in (_stale((4, 4)), _adding((4, 4))):
        for t in unfused:
            main.add(t)
        added.append(main.grad)
    assert torch.equal(added[0], added[1])


def test_settle_zeroes_the_views_nothing_wrote_and_leaves_the_rest() -> None:
    untouched, written = _stale((4, 4)), _stale((4, 4))
    written.add(torch.ones(4, 4))
    cleared = MainGrad(torch.full((4, 4), 7.0))  # zero_grads cleared it (the 7s stand for zeros): not touched again
    cleared.reset(zeroed=True)
    for main in (untouched, written, cleared):
        main.settle()
    assert torch.equal(untouched.grad, torch.zeros(4, 4)) and torch.equal(written.grad, torch.ones(4, 4))
    assert torch.equal(cleared.grad, torch.full((4, 4), 7.0))


def test_fused_flat_buffers_start_a_step_without_clearing_and_end_it_on_the_same_gradients() -> None:
    """zero_grads with fused gradients runs nothing on the buffer (the 4 bytes a parameter it would clear); a step
    over the last step's values (every view NaN) ends, after settle, on the gradients a step from cleared buffers
    gets, bit for bit, and the padding between the views is still zero; settle zeroes what no backward reached.
    Unfused, zero_grads clears the buffer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "compute_dtype": "fp32", "seq_length": 32}))
    torch.manual_seed(0)
    model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    buffers = FlatBuffers(model, fuse_wgrad=True, dp_size=4)  # DP 4: padding to a multiple of 4 x 64 too

    class Touches(TorchDispatchMode):  # the ops run on the gradient buffer's storage
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for a in [*args, *(kwargs or {}).values()]:
                if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == buffers.grads.untyped_storage().data_ptr():
                    self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, cfg.vocab_size, (2, cfg.seq_length + 1), generator=g) for _ in range(3)]

    def step() -> dict[str, torch.Tensor]:
        with Touches() as touched:
            buffers.zero_grads()
        for tokens in batches:
            model(tokens[:, :-1], tokens[:, 1:]).backward()
        buffers.settle()
        return touched.ops, {e.name: buffers.grad_view(e).clone() for e in buffers.entries}

    ops, first = step()  # the buffers start zeroed
    assert ops == []
    for e in buffers.entries:
        buffers.grad_view(e).fill_(float("nan"))
    _, again = step()
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    padding = torch.ones(buffers.numel, dtype=torch.bool)
    for e in buffers.entries:
        padding[e.start:e.end] = False
    assert padding.sum() > 0 and torch.equal(buffers.grads[padding], torch.zeros(int(padding.sum())))
    buffers.zero_grads()  # a step that reached no parameter: settle leaves zeros, not the last step's gradients
    buffers.settle()
    assert buffers.grads.abs().sum() == 0
    unfused = FlatBuffers(model, fuse_wgrad=False)
    unfused.grads.fill_(1.0)
    with Touches() as touched:
        unfused.zero_grads()
    assert unfused.grads.abs().sum() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["baseline", "quack"])
def test_gemm_fc1_versions_add_into_the_main_grad_on_the_gpu(version: str) -> None:
    """The CUDA versions honour the main_grad contract: dW in fp32 against fp64 (1e-2, as the version tests: the
    gate's backward is bf16) and no less accurate than their unfused dW summed over the micro-batches."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device machine)")
    cuda = torch.device("cuda")
    fused, (x, w) = _fc1_grads(version, cuda, torch.bfloat16, True)
    unfused, _ = _fc1_grads(version, cuda, torch.bfloat16, False)
    want = _fc1_fp64(x, w)
    assert rel(fused.cpu(), want) < 1e-2 and rel(fused.cpu(), want) <= rel(unfused.cpu(), want) * 1.05


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["baseline", "quack"])
def test_gemm_output_versions_add_into_the_main_grad_on_the_gpu(version: str) -> None:
    """The CUDA versions honour gemm_output's main_grad contract: the scaled dW in fp32 against fp64 (1e-2, bf16
    d loss / d logits, as the version tests) and no less accurate than their unfused dW summed over the
    micro-batches. quack's defers dW to the backward and puts the loss scale on h instead of on dW."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device machine)")
    cuda = torch.device("cuda")
    want = _output_fp64(cuda, torch.bfloat16)
    fused, unfused = (_output_grads(version, cuda, torch.bfloat16, f).cpu() for f in (True, False))
    assert rel(fused, want) < 1e-2 and rel(fused, want) <= rel(unfused, want) * 1.05


@pytest.mark.gpu
@pytest.mark.parametrize("masked", [0.0, 0.95], ids=["heavy-head", "tp-shard"])
def test_rows_summed_by_id_on_the_gpu_at_the_8b_shape(masked, torch_deterministic) -> None:
    """The embedding's backward at MiniCPM4-8B's shape (8192 token rows of 4096 into 73472), tokens drawn with a
    heavy head (one id a tenth of the rows), and as a TP rank's shard sees them (95 % another rank's, masked to
    row 0): bitwise twice under torch's deterministic mode, 1e-6 from fp64 (1e-5 for the shard: row 0 is an fp32
    sum of ~7,800 rows, sqrt(n) * 2^-24 ~ 5e-6)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device machine)")
    cuda = torch.device("cuda")
    g = torch.Generator().manual_seed(5)
    index = (torch.rand(8192, generator=g) ** 4 * 73472).long()
    index[:819] = 2
    index[torch.rand(8192, generator=g) < masked] = 0
    rows = torch.randn(8192, 4096, generator=g)
    got = []
    for _ in range(2):
        grad = torch.zeros(73472, 4096, device=cuda)
        add_rows_by_id(grad, index.to(cuda), rows.to(cuda))
        got.append(grad)
    assert torch.equal(got[0], got[1])
    touched = index.unique()
    want = torch.zeros(73472, 4096, dtype=torch.float64).index_add_(0, index, rows.double())[touched]
    assert rel(got[0][touched.to(cuda)].cpu(), want) < (1e-5 if masked else 1e-6)


@pytest.mark.gpu
def test_cublas_fp32_accumulation_and_sorted_embedding_rows_on_the_gpu() -> None:
    """bf16 x bf16 -> fp32, three micro-batches (the first written by torch.mm out_dtype, the others added with beta 1
    in place by torch.addmm out_dtype), against fp64;
    the embedding's rows summed in the same order twice (bitwise), against fp64."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device machine)")
    cuda = torch.device("cuda")
    x, w, dys = _linear_case(cuda)
    fused, _ = _fused_wgrad(x, w, dys)
    assert fused.dtype == torch.float32 and rel(fused, _fp64_wgrad(x, dys)) < 1e-6
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (8, 512), generator=g).to(cuda)
    dy = torch.randn(8, 512, 256, generator=g).to(cuda, torch.bfloat16)
    sums = []
    for _ in range(2):
        wt = torch.zeros(1000, 256, device=cuda, dtype=torch.bfloat16, requires_grad=True)
        main = MainGrad(torch.zeros(1000, 256, device=cuda))
        attach_main_grad(wt, main)
        fused_embedding(ids, wt).backward(dy)
        sums.append(main.grad)
    assert torch.equal(sums[0], sums[1])
    want = torch.zeros(1000, 256, dtype=torch.float64).index_add_(0, ids.cpu().reshape(-1), dy.cpu().double().reshape(-1, 256))
    assert rel(sums[0].cpu(), want) < 1e-6
