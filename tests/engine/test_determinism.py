"""--deterministic: same-seed runs and resumes compute the same bits.

CPU: the switch itself (torch's deterministic mode, the cuBLAS workspace pin and its refusal of a user's
non-reproducible value). GPU (`-m gpu`, the device machine): the reported defect of issue 13, on the
same preset and seed: minicpm4-0.5b, seed 7, 8 steps, two runs and a resume from step 4, with the
CuTeDSL defaults and with the torch baselines; and the same at TP 2 on two GPUs (NCCL, torchrun). Bitwise means every [LOSS] field but time and MFU is
the same string (`.9e` loss and grad norm).
"""

import shutil
from dataclasses import replace

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.train import make_reproducible
from tests.engine.helpers import deterministic_fields, loss_lines, run_engine
from tests.parallel.launch import torchrun

CUBLAS = "CUBLAS_WORKSPACE_CONFIG"


@pytest.fixture
def torch_mode():
    """Leave torch's global deterministic switches as the test found them."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]


def test_deterministic_mode_turns_on_torchs_switches_and_pins_cublas(monkeypatch, torch_mode) -> None:
    monkeypatch.delenv(CUBLAS, raising=False)
    torch.use_deterministic_algorithms(False)
    make_reproducible(EngineConfig(), "cuda")  # sets switches only: no CUDA call is made
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    import os

    assert os.environ[CUBLAS] == ":4096:8"


def test_a_users_reproducible_cublas_setting_is_kept_and_another_refused(monkeypatch, torch_mode) -> None:
    import os

    monkeypatch.setenv(CUBLAS, ":16:8")
    make_reproducible(EngineConfig(), "cuda")
    assert os.environ[CUBLAS] == ":16:8"
    monkeypatch.setenv(CUBLAS, ":0:0")
    with pytest.raises(ConfigError, match=r"--deterministic.*CUBLAS_WORKSPACE_CONFIG=':0:0'.*--no-deterministic"):
        make_reproducible(EngineConfig(), "cuda")


def test_no_deterministic_leaves_torch_alone(monkeypatch, torch_mode) -> None:
    monkeypatch.delenv(CUBLAS, raising=False)
    torch.use_deterministic_algorithms(False)
    make_reproducible(replace(EngineConfig(), deterministic=False), "cuda")
    import os

    assert not torch.are_deterministic_algorithms_enabled() and CUBLAS not in os.environ


def test_the_flag_reaches_the_run_header(trained, tmp_path) -> None:
    """On by default (the shared 3-step run of tests/engine/conftest.py, no flag given), off with --no-deterministic."""
    on_stdout = trained[2]
    off = run_engine("pretrain", "--preset", "tiny", "--device", "cpu", "--num-steps", "1", "--warmup-steps", "0", "--eval-samples", "0",
                     "--seq-length", "32", "--micro-batch-size", "2", "--no-save-final", "--no-deterministic",
                     "--run-dir", str(tmp_path / "off"))
    assert '"deterministic": true' in on_stdout and '"deterministic": false' in off.stdout


BASELINE = ["--op-attention", "baseline", "--op-rmsnorm", "baseline", "--op-gemm-fc1", "baseline",
            "--op-gemm-output", "baseline"]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# fp8-*: --fp8 (issue 32: same-seed and resume bit for bit with FP8 on; at TP 2 its GEMMs on NCCL ranks) with the
# plain-torch ops, fp8-defaults: tensorwise at the CuTeDSL defaults with gemm_fc1 `compiled` (quack's has no FP8
# path), as the FP8 benchmarks run, fp8-wgrad-quack: the same with the weight gradients added in quack's GEMM
# epilogue (--op-fp8-wgrad quack), and fp8-fast-accum: the fastest FP8 configuration (each weight cast once a step,
# the forward GEMMs accumulating fast, as torchao's recipes do), fp8-quack: FC1 on quack's gated GEMM in FP8 and the
# operands cast by the Triton kernels (--op-fp8-cast triton), fp8-triton: FC1's SwiGLU and the casts in the Triton
# kernels (the SwiGLU backward's amax atomically merged: order-free, so still bit for bit) with the weight gradients
# added in cuBLASLt's GEMM epilogue (the CUDA default since the seventeenth session: its algorithm fixed a shape),
# fp8-wgrad-baseline: the same with the baseline's product-then-add (--op-fp8-wgrad baseline).
OPS = {"defaults": [], "baseline": BASELINE, "fp8-tensorwise": [*BASELINE, "--fp8", "tensorwise"],
       "fp8-rowwise": [*BASELINE, "--fp8", "rowwise"], "fp8-defaults": ["--op-gemm-fc1", "compiled", "--fp8", "tensorwise"],
       "fp8-wgrad-quack": ["--op-gemm-fc1", "compiled", "--fp8", "tensorwise", "--op-fp8-wgrad", "quack"],
       "fp8-fast-accum": ["--op-gemm-fc1", "compiled", "--fp8", "tensorwise", "--fp8-weight-cache", "--fp8-fast-accum"],
       "fp8-quack": ["--op-gemm-fc1", "quack", "--fp8", "tensorwise", "--fp8-weight-cache", "--op-fp8-cast", "triton"],
       "fp8-triton": ["--op-gemm-fc1", "triton", "--fp8", "tensorwise", "--fp8-weight-cache", "--op-fp8-cast", "triton"],
       "fp8-wgrad-baseline": ["--op-gemm-fc1", "triton", "--fp8", "tensorwise", "--fp8-weight-cache", "--op-fp8-cast",
                              "triton", "--op-fp8-wgrad", "baseline"]}


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 2], ids=["1gpu", "tp2"])
@pytest.mark.parametrize("ops", list(OPS))
def test_gpu_same_seed_runs_and_a_resume_are_bitwise(ops, tp, tmp_path) -> None:
    if _gpus() < tp:
        pytest.skip(f"needs {tp} GPUs; this machine has {_gpus()}")
    common = ["pretrain", "--preset", "minicpm4-0.5b", "--device", "cuda", "--seed", "7", "--num-steps", "8",
              "--warmup-steps", "2", "--eval-samples", "0", "--seq-length", "2048", "--micro-batch-size", "2",
              *(["--tp", "2"] if tp == 2 else []), *OPS[ops]]

    def run(*args: str):
        return torchrun(2, *common, *args, timeout=900) if tp == 2 else run_engine(*common, *args, timeout=900)

    first = run("--save-every", "4", "--keep-last", "3", "--run-dir", str(tmp_path / "a"))
    second = run("--no-save-final", "--run-dir", str(tmp_path / "b"))
    a = [deterministic_fields(x) for x in loss_lines(first.stdout)]
    b = [deterministic_fields(x) for x in loss_lines(second.stdout)]
    assert len(a) == 8 and a == b, "\n".join(f"{x}\n{y}" for x, y in zip(a, b) if x != y)

    # Resume from step 4 in a fresh folder: steps 5..8 must repeat the uninterrupted run's bits.
    ckpt = tmp_path / "a" / "checkpoints" / "step_00000004"
    assert ckpt.is_dir(), sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    shutil.copytree(ckpt, tmp_path / "c" / "checkpoints" / ckpt.name)
    resumed = run("--no-save-final", "--resume", str(tmp_path / "c" / "checkpoints" / ckpt.name),
                  "--run-dir", str(tmp_path / "c"))
    c = [deterministic_fields(x) for x in loss_lines(resumed.stdout)]
    assert c == a[4:], "\n".join(f"{x}\n{y}" for x, y in zip(c, a[4:]) if x != y)
