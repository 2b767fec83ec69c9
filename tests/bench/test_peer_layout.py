"""`bench/mfu.py --peer NAME[:LAYOUT]`: a peer's own layout, parsed, completed from the engine's flags and checked.

- Defaults come from the job: the engine's --tp and --micro-batch-size, dp = GPUs / tp; sp on with TP for the
  peers that have it; compile on for torchtitan, off for megatron-core.
- The arithmetic: nproc = tp x dp = the job's GPUs, GAS = global batch / (mbs x dp), so every row of one job
  trains the same tokens per step on the same GPUs (the MFU ratio is a tokens/s ratio).
- A layout that cannot run is refused before anything starts: one line naming --peer, the value and the fix,
  exit 2, no --out written.
- The layouts bench/ops_session.sh peers4 spends a device call on resolve here.
Seconds: no peer runs (the CPU probes of the peers themselves are in test_peers_cpu.py, slow).
"""

import json

import pytest

from bench.mfu import main as mfu_main
from bench.mfu import peer_layouts
from bench.peers.common import engine_config
from bench.peers.layout import LayoutError, layout_flags, parse_peer, resolve_layout

FOUR = ["--preset", "minicpm4-8b", "--micro-batch-size", "2", "--seq-length", "4096", "--global-batch-size", "16",
        "--device", "cpu"]


def _resolve(spec: str, flags=FOUR, nproc=4):
    return resolve_layout(spec, engine_config(flags, nproc), nproc)


@pytest.mark.parametrize("spec, expected", [
    # peer, tp, dp, sp, ac, compile, mbs, gas: the peers4 rows of bench/ops_session.sh
    ("torchtitan:dp=4,ac=selective", ("torchtitan", 1, 4, False, "selective", True, 2, 2)),
    ("torchtitan:tp=2,dp=2,ac=selective", ("torchtitan", 2, 2, True, "selective", True, 2, 4)),
    ("megatron-core:tp=2,dp=2,ac=selective,mbs=1", ("megatron-core", 2, 2, True, "selective", False, 1, 8)),
    ("megatron-core:tp=1,dp=4,ac=selective,mbs=1", ("megatron-core", 1, 4, False, "selective", False, 1, 4)),
    # defaults: the engine's --tp 1 and mbs 2, dp = 4 GPUs / tp
    ("torchtitan", ("torchtitan", 1, 4, False, "none", True, 2, 2)),
    ("megatron-core:tp=2", ("megatron-core", 2, 2, True, "none", False, 2, 4)),
    ("megatron-core:tp=2,sp=off,ac=full,mbs=4", ("megatron-core", 2, 2, False, "full", False, 4, 2)),
    ("torchtitan:compile=off,mbs=1", ("torchtitan", 1, 4, False, "none", False, 1, 4)),
])
def test_layouts_complete_from_the_job_and_keep_its_global_batch(spec, expected):
    peer, layout = _resolve(spec)
    assert (peer, layout.tp, layout.dp, layout.sp, layout.ac, layout.compile, layout.mbs, layout.gas) == expected
    assert layout.nproc == 4 and layout.mbs * layout.gas * layout.dp == 16
    # the peer's own config (what bench/peers/run.py builds) resolves on tp x dp processes to the same batch
    cfg = engine_config([*FOUR, *layout_flags(layout)], layout.nproc)
    assert (cfg.tp, cfg.micro_batch_size, cfg.grad_accum_steps) == (layout.tp, layout.mbs, layout.gas)
    assert cfg.tokens_per_step == 16 * 4096
    record = layout.record(peer)
    assert record["nproc"] == 4 and record["dp_mode"] == {"torchtitan": "fsdp2", "megatron-core": "distributed-optimizer"}[peer]


def test_without_nproc_a_peer_runs_on_the_engines_tp_gpus():
    """The one- and two-GPU jobs of before: nproc = the engine's --tp, dp 1, GAS from --grad-accum-steps."""
    flags = ["--preset", "minicpm4-8b", "--tp", "2", "--micro-batch-size", "2", "--grad-accum-steps", "8", "--device", "cpu"]
    [(peer, given, layout)] = peer_layouts(["megatron-core"], flags, 0)
    assert (peer, given, layout.tp, layout.dp, layout.gas, layout.nproc) == ("megatron-core", "", 2, 1, 8, 2)
    assert layout.short(peer) == "tp2-sp-mbs2"
    [(_, _, one)] = peer_layouts(["torch-compile"], ["--preset", "tiny", "--device", "cpu"], 0)
    assert (one.tp, one.dp, one.nproc, one.compile) == (1, 1, 1, True)


def test_names_say_the_layout():
    assert _resolve("torchtitan:tp=2,dp=2,ac=selective")[1].short("torchtitan") == "tp2-fsdp2-sp-sac-compile-mbs2"
    assert _resolve("megatron-core:tp=2,ac=full,mbs=1")[1].short("megatron-core") == "tp2-distopt2-sp-fullac-mbs1"
    assert _resolve("torchtitan:tp=2,async_tp=on")[1].short("torchtitan") == "tp2-async-fsdp2-sp-compile-mbs2"


@pytest.mark.parametrize("spec, message", [
    ("nemo:tp=2", "'nemo' is not a peer; use one of torch-compile, torchao-fp8, torchtitan, megatron-core"),
    ("torchtitan:pp=2", "'pp=2' is not a key=value of the layout; use keys tp, dp, sp, ac, compile, mbs, async_tp"),
    ("torchtitan:tp", "'tp' is not a key=value"),
    ("torchtitan:tp=two", "tp='two' is not a positive integer; write e.g. tp=2"),
    ("torchtitan:tp=0", "tp='0' is not a positive integer"),
    ("torchtitan:tp=2,tp=1", "tp is given twice"),
    ("torchtitan:sp=yes", "sp='yes' is neither on nor off; write sp=on or sp=off"),
    ("torchtitan:ac=some", "ac='some' is not a checkpointing mode; use ac=none | ac=selective | ac=full"),
    ("torchtitan:tp=3", "tp=3 does not divide the job's 4 GPUs; use a divisor of 4"),
    ("torchtitan:tp=2,dp=1", "tp=2 x dp=1 = 2 processes, the job has 4 GPUs; set dp=2"),
    ("torchtitan:tp=4", "tp=4 does not divide --num-kv-heads 2; use a tp that divides 2"),
    ("torchtitan:tp=2,sp=off", "torchtitan's TP plan always shards norms and residuals over the sequence"),
    ("megatron-core:tp=1,sp=on", "sp=on needs tp > 1"),
    ("megatron-core:compile=on", "megatron-core does not torch.compile its model"),
    ("torch-compile", "torch-compile is a one-GPU peer; run it in a job of one GPU (tp=1, dp=1)"),
    ("torchao-fp8", "torchao-fp8 is a one-GPU peer; run it in a job of one GPU (tp=1, dp=1)"),
    ("torchao-fp8:tp=1,dp=4,ac=selective", "torchao-fp8 is a one-GPU peer"),
    ("torchtitan:mbs=3", "the global batch of 16 sequences does not split into mbs=3 x dp=4; use an mbs that divides 4"),
    ("torchtitan:async_tp=on", "async_tp=on is torchtitan's, with tp > 1 and compile=on"),
    ("torchtitan:tp=2,compile=off,async_tp=on", "async_tp=on is torchtitan's, with tp > 1 and compile=on"),
    ("megatron-core:tp=2,async_tp=on", "use it with torchtitan:tp=2,compile=on, or leave it out"),
])
def test_a_layout_that_cannot_run_is_refused_with_its_fix(spec, message):
    with pytest.raises(LayoutError) as err:
        _resolve(spec)
    assert str(err.value).startswith(f"--peer {spec!r}: ") and message in str(err.value)


def test_parse_keeps_only_the_keys_given():
    assert parse_peer("megatron-core:tp=2,sp=on,ac=selective,compile=off,mbs=1") == (
        "megatron-core", {"tp": 2, "sp": True, "ac": "selective", "compile": False, "mbs": 1})
    assert parse_peer("torchtitan") == ("torchtitan", {})


def test_mfu_refuses_a_bad_layout_before_any_run(tmp_path, capsys):
    """One line on stderr naming the flag, the value and the fix; exit 2; no engine run, no --out."""
    out = tmp_path / "mfu.json"
    code = mfu_main(["--device", "cpu", "--nproc", "4", "--common", " ".join(FOUR[:-2]), "--variant", "dp4=",
                     "--peer", "torchtitan:dp=4", "--peer", "megatron-core:tp=2,dp=1", "--out", str(out)])
    err = capsys.readouterr()
    assert code == 2 and not out.exists()
    assert err.err.strip().splitlines() == ["bench/mfu.py: --peer 'megatron-core:tp=2,dp=1': tp=2 x dp=1 = 2 processes, "
                                            "the job has 4 GPUs; set dp=2 (every row of one job runs on the same GPUs)"]
    assert "[dp4]" not in err.out  # the engine variant never started


def test_mfu_sweep_refuses_a_layout_that_sets_the_micro_batch(tmp_path, capsys):
    code = mfu_main(["--device", "cpu", "--common", "--preset tiny", "--sweep", "--seqs", "16", "--mbs", "1",
                     "--peer", "torchtitan:mbs=2", "--out", str(tmp_path / "s.json")])
    assert code == 2 and "--sweep sets the micro-batch size (--mbs); leave mbs out of the layout" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


def test_a_peer_record_keeps_its_layout_when_it_cannot_start(tmp_path, monkeypatch):
    """run_peer's record names the layout even when the peer process wrote nothing (it died before its JSON)."""
    import argparse

    import bench.mfu as mfu

    class Ran:
        returncode, stdout, stderr, wall_s, timed_out = 1, "", "boom", 0.1, False

        def tail(self, *_):
            return "boom"

    monkeypatch.setattr(mfu, "_run", lambda cmd, nproc, args, timeout, max_connections: Ran())
    monkeypatch.setattr(mfu, "GpuPoller", lambda: type("P", (), {"stop": lambda self: {"used_gib": [], "sm_mhz": [],
                                                                                        "power_w": []}})())
    peer, layout = _resolve("megatron-core:tp=2,dp=2,ac=selective,mbs=1")
    args = argparse.Namespace(steps=1, warmup=0, device="cpu", profile_peers=False, peak_tflops=0.0, peer_timeout=1.0,
                              max_connections=1)
    record = mfu.run_peer(peer, "", FOUR, args, ("tp=2,dp=2,ac=selective,mbs=1", layout))
    assert record["name"] == "megatron-core tp2-distopt2-sp-sac-mbs1" and record["error"] == "boom"
    assert record["layout"]["gas"] == 8 and record["nproc"] == 4 and record["cuda_device_max_connections"] == "1"
    assert record["cmd"][record["cmd"].index("--layout") + 1] == "tp=2,dp=2,ac=selective,mbs=1"
    assert "--nproc-per-node" in record["cmd"] and record["cmd"][record["cmd"].index("--nproc-per-node") + 1] == "4"
    json.dumps(record)


def test_the_peers4_device_mode_runs_layouts_that_resolve():
    """bench/ops_session.sh peers4 spends a 10-minute device call: every --peer it names must resolve against its
    flags on its 4 GPUs here, and every row keeps the job's 16 x 4096 global batch."""
    import re
    import shlex

    from tests.conftest import REPO

    script = (REPO / "bench/ops_session.sh").read_text()
    four = shlex.split(re.search(r'^FOUR="([^"]+)"', script, re.M).group(1))
    mode = script[script.index("\n  peers4)"):]
    mode = mode[:mode.index(";;")]
    assert '--nproc 4 --common "$FOUR"' in mode
    specs = re.findall(r"--peer (\S+)", mode)
    assert [s.split(":")[0] for s in specs] == ["torchtitan", "torchtitan", "megatron-core", "megatron-core"]
    layouts = peer_layouts(specs, [*four, "--device", "cpu"], 4)
    assert [(peer, layout.short(peer)) for peer, _, layout in layouts] == [
        ("torchtitan", "tp1-fsdp4-sac-compile-mbs2"), ("torchtitan", "tp2-fsdp2-sp-sac-compile-mbs2"),
        ("megatron-core", "tp2-distopt2-sp-sac-mbs1"), ("megatron-core", "tp1-distopt4-sac-mbs1")]
    assert all(layout.mbs * layout.gas * layout.dp == 16 for _, _, layout in layouts)
