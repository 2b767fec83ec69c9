"""--document-mask on CUDA (GPU): FA4's varlen path in whole runs and under --deterministic.

1. Whole training runs with the mask, the CUDA defaults (fa4-tuned: FA4's varlen kernels) against all
   ops forced to baseline (SDPA with the block-diagonal mask), on a corpus of short documents:
   per-step loss within 3e-2 relative over 8 steps, the tolerance and reasons of
   tests/engine/test_gpu_default_kernels.py (bf16 kernels rounding at different points, drift over
   steps at lr 1e-2). This catches a varlen path that fails, mis-scales or mis-shapes; it cannot tell a
   kernel that attends across documents (in 8 steps on this data the unmasked run is only ~0.3 % away,
   measured on CPU): the op-level cases below are what hold the boundaries to account.
2. One forward of the tiny model (bf16, same init) on windows packing documents: the CUDA default
   attention (fa4-tuned's varlen path) against the baseline's masked SDPA, logits within 2e-2
   relative (two bf16 attentions rounding at different points, ~4e-3 each, through 4 layers), while
   the same model without the mask is > 0.1 away: this one does see a kernel that crosses documents.
3. The varlen backward under torch.use_deterministic_algorithms (the engine's --deterministic): every
   FA4 version gives bit-identical gradients for the same inputs on two calls, at 8B TP 2 shapes.

Op-level accuracy (every CUDA version with documents against the fp32 baseline with the mask, rel.
1e-2 and within 2x the bf16 baseline's own error): tests/ops/test_ops_versions_gpu.py, the `_documents`
cases of tests/ops/gpu_cases.py.
"""

import math

import pytest
import torch

from engine.ops.dispatch import load_op, load_register
from engine.ops.workloads import synthetic_documents
from tests.engine.helpers import deterministic_fields, loss_lines, run_engine
from tests.engine.test_document_mask import short_documents
from tests.engine.test_gpu_default_kernels import BASELINE

pytestmark = pytest.mark.gpu

FA4_VERSIONS = [v for v in load_register("attention").versions if v != "baseline"]


def test_default_kernels_train_like_the_baseline_with_the_mask(tmp_path):
    pytest.importorskip("datasets", reason="--hf-dataset reads the short-document corpus through HF datasets")
    data = tmp_path / "short"
    data.mkdir()
    short_documents(data, 3000, 1, "train")
    short_documents(data, 200, 2, "validation")
    common = ["pretrain", "--preset", "tiny", "--device", "cuda", "--num-steps", "8", "--warmup-steps", "2",
              "--eval-samples", "0", "--no-save-final", "--hf-dataset", str(data), "--data-cache-dir", str(tmp_path / "c")]
    masked = ["--document-mask", "--reset-position-ids"]
    fast = run_engine(*common, *masked, "--run-dir", str(tmp_path / "fast"), timeout=600)
    base = run_engine(*common, *masked, *BASELINE, "--run-dir", str(tmp_path / "base"), timeout=600)
    plain = run_engine(*common, *BASELINE, "--run-dir", str(tmp_path / "plain"), timeout=600)
    assert "fa4-tuned" in fast.stdout
    lf, lb, lp = ([float(deterministic_fields(x)[1]) for x in loss_lines(p.stdout)] for p in (fast, base, plain))
    assert len(lf) == len(lb) == len(lp) == 8
    assert lf[-1] < lf[0]
    for step, (a, b) in enumerate(zip(lf, lb), start=1):
        assert abs(a - b) <= 3e-2 * abs(b), f"step {step}: defaults {a} vs baseline {b} (both masked)"
    assert lb != lp, "the mask changed nothing on this data"


def test_model_logits_with_the_mask_match_the_baseline_attention():
    from engine.config import build_config, resolve
    from engine.distributed import ParallelState
    from engine.model import batch_documents, build_model
    from engine.ops import resolve_ops

    cuda = torch.device("cuda", torch.cuda.current_device())
    tokens = torch.randint(0, 256, (4, 256), generator=torch.Generator().manual_seed(5))
    tokens[:, 17::41] = 257  # documents of 41 tokens, a short first one in each row

    def logits(**overrides):
        cfg = resolve(build_config({"preset": "tiny", "device": "cuda", "seq_length": 256, **overrides}))
        model = build_model(cfg, ParallelState.single(cuda), resolve_ops(cfg, cuda), torch.bfloat16)
        return model.logits(tokens.to(cuda), batch_documents(cfg, tokens, 257, cuda)), resolve_ops(cfg, cuda).versions

    fast, versions = logits(document_mask=True, reset_position_ids=True)
    base, base_versions = logits(document_mask=True, reset_position_ids=True, op_attention="baseline")
    plain, _ = logits()
    assert versions["attention"] != "baseline" and base_versions["attention"] == "baseline"
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(fast, base) < 2e-2
    assert rel(plain, base) > 0.1


@pytest.mark.parametrize("version", FA4_VERSIONS)
def test_varlen_backward_is_deterministic(version):
    fn = load_op("attention", version)
    b, s, hq, hkv, d = 2, 4096, 16, 1, 128  # MiniCPM4-8B at TP 2
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(b, s, h, d, generator=g, device="cuda").bfloat16().requires_grad_() for h in (hq, hkv, hkv))
    cu, longest = synthetic_documents(b, s, seed=3, device="cuda")
    dout = torch.randn(b, s, hq, d, generator=g, device="cuda").bfloat16()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(2):
            for t in (q, k, v):
                t.grad = None
            fn(q, k, v, softmax_scale=1 / math.sqrt(d), cu_seqlens=cu, max_seqlen=longest).backward(dout)
            grads.append([t.grad.clone() for t in (q, k, v)])
    finally:
        torch.use_deterministic_algorithms(was)
    for name, first, second in zip("qkv", *grads):
        assert torch.equal(first, second), f"d{name} differs between two deterministic calls ({version})"
