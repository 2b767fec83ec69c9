"""--fsdp on GPUs (NCCL, bf16 all-gathers, fp32 reduce-scatters, CuTeDSL op versions; two layers of MiniCPM4-8B at
the benchmark's shapes, so bench/ops_session.sh's warmed kernels serve): deterministic mode gives the
same bits run to run, and a resume continues bit for bit. Needs 2 CUDA GPUs (`-m gpu`); TP 1 x DP 2 and TP 2 x DP 2
when 4 are there, and TP 1 x DP 2 with the speed knobs (the streams they reorder must not change a bit); with --fp8
tensorwise, --fsdp-fp8-all-gather against the bf16 gather, bit for bit. Bitwise: every [LOSS] field but time and MFU
is the same string."""

import pytest
import torch

from tests.engine.helpers import deterministic_fields, loss_lines
from tests.parallel.launch import torchrun

COMMON = ["pretrain", "--preset", "minicpm4-8b", "--num-layers", "2", "--device", "cuda", "--seed", "7", "--num-steps", "6",
          "--warmup-steps", "2", "--seq-length", "4096", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--eval-samples", "0", "--fsdp", "--deterministic", "--save-every", "3", "--no-save-final"]

NO_SAVE = ["--save-every", "0", "--no-save-final"]  # only the first run writes (2-layer 8B: ~10 GB a checkpoint)


# every --fsdp speed knob away from its default but --fsdp-reduce-dtype (GAS 2 at TP 1 x DP 2: two micro-batches)
KNOBS = ["--fsdp-reshard-after-forward", "never", "--fsdp-grad-sync", "step", "--fsdp-prefetch", "1"]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [(2, 1, ()), (4, 2, ()), (2, 1, tuple(KNOBS))],
                         ids=["tp1xdp2", "tp2xdp2", "tp1xdp2-knobs"])
def test_fsdp_is_bitwise_run_to_run_and_across_a_resume(layout, tmp_path) -> None:
    nproc, tp, knobs = layout
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} CUDA GPUs")
    args = [*COMMON, "--tp", str(tp), *knobs]
    a = torchrun(nproc, *args, "--run-dir", str(tmp_path / "a"), timeout=900)
    b = torchrun(nproc, *args, *NO_SAVE, "--run-dir", str(tmp_path / "b"), timeout=900)
    first = [deterministic_fields(x) for x in loss_lines(a.stdout)]
    assert len(first) == 6 and [deterministic_fields(x) for x in loss_lines(b.stdout)] == first
    resumed = torchrun(nproc, *args, "--resume", str(tmp_path / "a" / "checkpoints" / "step_00000003"), *NO_SAVE,
                       "--run-dir", str(tmp_path / "resumed"), timeout=900)
    assert [deterministic_fields(x) for x in loss_lines(resumed.stdout)] == first[3:]


@pytest.mark.gpu
@pytest.mark.parametrize("nproc, tp", [(2, 1), (4, 2)], ids=["tp1xdp2", "tp2xdp2"])
def test_fp8_all_gather_is_the_bf16_gather_bit_for_bit(nproc, tp, tmp_path) -> None:
    """--fsdp --fp8 tensorwise with and without --fsdp-fp8-all-gather on NCCL: the FP8 bytes FSDP2 gathers (each
    shard cast eagerly with the DP-reduced scale) are the ones the linear's compiled cast makes of the gathered bf16
    weight, so every [LOSS] field but time and MFU is the same (docs/engine/sharding.md)."""
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"needs {nproc} CUDA GPUs")
    args = [*COMMON[:COMMON.index("--save-every")], *NO_SAVE, "--num-steps", "3", "--tp", str(tp), "--fp8", "tensorwise"]
    plain = torchrun(nproc, *args, "--run-dir", str(tmp_path / "bf16_gather"), timeout=900)
    fp8 = torchrun(nproc, *args, "--fsdp-fp8-all-gather", "--run-dir", str(tmp_path / "fp8_gather"), timeout=900)
    want = [deterministic_fields(x) for x in loss_lines(plain.stdout)]
    assert len(want) == 3 and [deterministic_fields(x) for x in loss_lines(fp8.stdout)] == want
