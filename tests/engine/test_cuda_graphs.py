"""--cuda-graphs: replayed micro-batches compute the same bits as the eager ones (engine/cuda_graph.py).

The eager engine is the reference here: it is checked against HF Llama and fp32 PyTorch elsewhere
(tests/engine/test_reference.py and others), and a graph replays the kernels the eager micro-batch launched, on the
same data, so any difference at all is a defect: inputs or token counts not copied in before a replay, a gradient
added twice or not at all (the Python-side hooks run only during capture), a step's first gradients added onto the
last step's instead of written (the two graphs swapped, or FlatBuffers.settle zeroing what a replay wrote), weights
or their --fp8-weight-cache copies read from stale memory after the optimizer or a resume wrote them. Bitwise
means every [LOSS] field but time and MFU, and every [EVAL] line, is the same string. GPU only (`-m gpu`): a CPU run refuses the flag (tests/engine/test_bad_input.py).
"""

import shutil

import pytest
import torch

from tests.engine.helpers import deterministic_fields, eval_lines, loss_lines, run_engine

BASELINE = ["--op-attention", "baseline", "--op-rmsnorm", "baseline", "--op-gemm-fc1", "baseline",
            "--op-gemm-output", "baseline", "--op-rope", "baseline"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [[], [*BASELINE, "--no-grad-accum-fusion", "--activation-checkpointing"],
                                     ["--fp8", "tensorwise", "--fp8-weight-cache"]],
                         ids=["defaults", "baseline-unfused-recompute", "fp8-weight-cache"])
def test_graphed_runs_and_a_graphed_resume_match_the_eager_run_bit_for_bit(variant, tmp_path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    common = ["pretrain", "--preset", "minicpm4-0.5b", "--device", "cuda", "--seed", "7", "--num-steps", "6",
              "--warmup-steps", "2", "--seq-length", "1024", "--micro-batch-size", "2", "--grad-accum-steps", "3",
              "--eval-every", "2", "--eval-samples", "8", *variant]
    eager = run_engine(*common, "--save-every", "3", "--run-dir", str(tmp_path / "eager"), timeout=900)
    graphed = run_engine(*common, "--cuda-graphs", "--no-save-final", "--run-dir", str(tmp_path / "graphed"),
                         timeout=900)
    a = [deterministic_fields(x) for x in loss_lines(eager.stdout)]
    b = [deterministic_fields(x) for x in loss_lines(graphed.stdout)]
    assert len(a) == 6 and a == b, "\n".join(f"{x}\n{y}" for x, y in zip(a, b) if x != y)
    assert eval_lines(eager.stdout) and eval_lines(graphed.stdout) == eval_lines(eager.stdout)

    # A graph captured after a resume reads the restored weights: steps 4..6 repeat the eager run's.
    ckpt = tmp_path / "eager" / "checkpoints" / "step_00000003"
    shutil.copytree(ckpt, tmp_path / "resumed" / "checkpoints" / ckpt.name)
    resumed = run_engine(*common, "--cuda-graphs", "--no-save-final", "--resume",
                         str(tmp_path / "resumed" / "checkpoints" / ckpt.name), "--run-dir", str(tmp_path / "resumed"),
                         timeout=900)
    c = [deterministic_fields(x) for x in loss_lines(resumed.stdout)]
    assert c == a[3:], "\n".join(f"{x}\n{y}" for x, y in zip(c, a[3:]) if x != y)
