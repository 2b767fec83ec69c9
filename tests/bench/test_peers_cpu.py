"""The peers at their own layouts on CPU (gloo), as far as a CPU runs them: slow (20-40 s each, two processes).

- torchtitan (0.3.0 on the GPU image's torch 2.11, with bench/peers/titan.py's stand-ins): its FSDP2 at dp 2 and its
  TP + sequence-parallel plan at tp 2, each with its op-level selective AC, a few whole steps: the loss falls, the
  built model has the engine's matmul parameters (build_step refuses it otherwise), the record names the layout and
  the versions. Flex attention has no CPU backward: the probe swaps in torchtitan's own SDPA backend, causal (the
  same math for one document per row); the GPU run keeps flex (run.py refuses sdpa on CUDA). Compile is off here
  (inductor on CPU adds ~60 s; it ran once by hand, see docs/benchmarks.md).
- megatron-core: its step needs CUDA; the probe builds its model at TP 2 + SP with selective recompute (CPU
  initialisation), checks the matmul parameters, and that the sequence-parallel norms are marked for the TP
  all-reduce of their gradients.
Skipped with the reason when the peer is not installed (the dev image has neither; a venv with torch 2.11 and the
peer wheels runs them: docs/benchmarks.md, "peers4").
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
TINY = ["--preset", "tiny", "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--device", "cpu"]


def _needs(module: str) -> None:
    # find_spec, not import: torchtitan 0.3.0 fails to import on torch < 2.12 until torch_compat has run
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        found = False
    if not found:
        pytest.skip(f"{module} is not installed in this interpreter ({sys.executable})")


def _torchrun(nproc: int, *args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("layout, name", [("dp=2,ac=selective,compile=off", "torchtitan tp1-fsdp2-sac-mbs2"),
                                          ("tp=2,ac=selective,compile=off", "torchtitan tp2-sp-sac-mbs2")])
def test_torchtitan_trains_at_its_layout(tmp_path, layout, name):
    _needs("torchtitan")
    out = tmp_path / "peer.json"
    proc = _torchrun(2, "-m", "bench.peers.run", "--peer", "torchtitan", "--layout", layout, "--attn-backend", "sdpa",
                     "--device", "cpu", "--steps", "3", "--warmup", "0", "--out", str(out), "--", *TINY)
    record = json.loads(out.read_text())
    assert proc.returncode == 0 and "error" not in record, record.get("traceback") or proc.stderr[-3000:]
    assert record["name"] == name and record["nproc"] == 2 and record["attn_backend"] == "sdpa"
    assert record["layout"]["nproc"] == 2 and record["layout"]["ac"] == "selective"
    assert record["layout"]["mbs"] * record["layout"]["gas"] * record["layout"]["dp"] == 8  # the job's global batch
    assert record["versions"]["torchtitan"] != "absent"
    losses = record["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0], losses


def test_megatron_core_builds_at_tp2_with_sequence_parallel_and_selective_recompute():
    _needs("megatron.core")
    proc = _torchrun(2, "-m", "bench.peers.megatron", "tp=2,ac=selective", "--", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["layout"] == {"tp": 2, "dp": 1, "sp": True, "ac": "selective", "compile": False, "mbs": 2, "gas": 4,
                               "async_tp": False, "nproc": 2, "dp_mode": "none"}
    assert (facts["tp"], facts["sequence_parallel"], facts["recompute_granularity"]) == (2, True, "selective")
    assert facts["recompute_modules"] == ["core_attn"] and facts["stand_ins"] == ["RMSNorm(sequence_parallel)"]
    assert facts["sequence_parallel_params"] == 2 * 4 + 1  # two norms per layer of the tiny preset, and the final one
