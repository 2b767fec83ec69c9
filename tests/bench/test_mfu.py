"""bench/mfu.py and its peers on CPU: same FLOP count, same model, end to end, sweep, missing peers.

- The FLOP count a peer's MFU uses is engine/flops.py's, and the peer's own built model has exactly the
  engine's matmul parameters (so its MFU compares like for like); a peer with other shapes is refused.
- The torch-compile peer computes the engine's model: with the engine's weights, in fp32 on the tiny
  muP preset, its loss and every gradient equal the engine's baseline ops within rel. 1e-5 (loss) and
  1e-4 (gradients): the two differ only in the order of fp32 reductions (fused vs separate scalings,
  nn.RMSNorm vs the engine's norm, SDPA layouts), which moves results by ~1e-7 relative per op.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.mfu import parse_variant
from bench.peers.common import check_matmul_params, engine_config, linear_params, summarize
from bench.peers.compiled import PeerDecoder, build_step, load_engine_weights, matmul_weights
from engine.distributed import ParallelState
from engine.flops import flops_per_token, matmul_params
from engine.model import build_model
from engine.ops import resolve_ops
from tests.conftest import REPO

CPU = torch.device("cpu")
EIGHT_B_SLICE = ["--preset", "minicpm4-8b", "--num-layers", "4", "--micro-batch-size", "2", "--seq-length", "4096",
                 "--grad-accum-steps", "8", "--device", "cpu"]
TINY = ["--preset", "tiny", "--seq-length", "32", "--micro-batch-size", "2", "--grad-accum-steps", "2", "--device", "cpu"]


@pytest.mark.parametrize("flags", [TINY, EIGHT_B_SLICE], ids=["tiny", "8b-4-layers"])
def test_peer_model_has_the_engines_matmul_params_and_flop_count(flags):
    cfg = engine_config(flags)
    with torch.device("meta"):
        peer = PeerDecoder(cfg)
    counted = linear_params(matmul_weights(peer), peer.lm_head.weight, cfg.vocab_size)
    assert counted == matmul_params(cfg)
    check_matmul_params(cfg, counted, "torch-compile")
    record = summarize("peer", cfg, [1.0], [0.0], CPU, 1)
    assert record["flops_per_token"] == flops_per_token(cfg)
    assert record["tokens_per_step"] == cfg.micro_batch_size * cfg.grad_accum_steps * cfg.seq_length


def test_peer_with_other_shapes_is_refused():
    cfg = engine_config(TINY)
    with torch.device("meta"):
        wider = PeerDecoder(engine_config([*TINY, "--ffn-hidden-size", "512"]))
    with pytest.raises(ValueError, match="not configured to the same model"):
        check_matmul_params(cfg, linear_params(matmul_weights(wider), wider.lm_head.weight, cfg.vocab_size), "peer")


def test_torch_compile_peer_computes_the_engines_model_in_fp32():
    cfg = engine_config(TINY)
    torch.manual_seed(0)
    engine = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    peer = PeerDecoder(cfg)
    load_engine_weights(peer, {n: p.detach() for n, p in engine.named_parameters()})
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length))
    labels = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length))
    labels[0, :3] = -100
    ref, ours = engine(tokens, labels), peer(tokens, labels)
    assert abs(ours.item() - ref.item()) / ref.item() < 1e-5
    ref.backward()
    ours.backward()
    names = {"embed.weight": "embed.weight", "lm_head": "lm_head.weight", "layers.1.attn.qkv": "layers.1.wqkv.weight",
             "layers.3.mlp.fc1": "layers.3.w_gate_up.weight", "layers.2.mlp_norm.weight": "layers.2.mlp_norm.weight"}
    engine_params, peer_params = dict(engine.named_parameters()), dict(peer.named_parameters())
    for theirs, mine in names.items():
        g_ref, g = engine_params[theirs].grad, peer_params[mine].grad
        assert ((g - g_ref).norm() / g_ref.norm()).item() < 1e-4, theirs


def test_torch_compile_peer_steps_reduce_the_loss_eagerly():
    cfg = engine_config(TINY)
    _, step = build_step(cfg, "fp32", CPU, compile_model=False)
    losses = [step() for _ in range(4)]
    assert losses[-1] < losses[0]


def _mfu(tmp_path, *extra, timeout=240):
    out = tmp_path / "mfu.json"
    proc = subprocess.run([sys.executable, "bench/mfu.py", "--device", "cpu", "--common",
                           "--preset tiny --seq-length 32 --micro-batch-size 2 --grad-accum-steps 2",
                           "--steps", "2", "--warmup", "1", "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_mfu_end_to_end_on_cpu_reports_a_peer_that_cannot_run(tmp_path):
    proc, data = _mfu(tmp_path, "--peer", "megatron-core")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    engine, peer = data["results"]
    assert engine["kind"] == "engine" and "error" not in engine
    assert engine["tokens_per_step"] == 2 * 2 * 32 and engine["median_step_s"] > 0
    assert engine["tokens_per_s"] == pytest.approx(engine["tokens_per_step"] / engine["median_step_s"])
    assert "attention=baseline" in engine["ops"] and engine["device"] == "cpu"
    assert len(engine["steps"]) == 3 and all(s["loss"] > 0 for s in engine["steps"])
    assert peer["name"] == "megatron-core tp1-mbs2" and peer["error"]  # not importable here, or CUDA only: said, not fatal
    assert peer["layout"] == {"tp": 1, "dp": 1, "sp": False, "ac": "none", "compile": False, "mbs": 2, "gas": 2,
                              "async_tp": False, "nproc": 1, "dp_mode": "none"}
    assert "megatron-core" in proc.stdout and "failed:" in proc.stdout


def _peer_processes() -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # not a process, or it exited while we looked
            continue
        if "bench.peers.run" in cmdline:
            found.append(cmdline)
    return found


def test_a_peer_past_its_timeout_is_stopped_with_its_workers_and_the_job_goes_on(tmp_path):
    """A hung peer (here: any peer given 2 s; torchrun and torch's import alone take longer) must not end the job
    or keep GPUs busy: it is stopped with torchrun's workers, reported, and the next row still runs (peers only: the
    engine's row is the test above's)."""
    proc, data = _mfu(tmp_path, "--no-engine", "--peer", "torch-compile", "--peer-timeout", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    peers = data["results"]
    assert [p["name"] for p in peers] == ["torch-compile bf16", "torch-compile amp"]
    for peer in peers:
        assert peer["error"].endswith("stopped after --peer-timeout 2 s"), peer["error"][-300:]
    assert proc.stdout.count("failed: stopped after --peer-timeout 2 s") == 2
    assert _peer_processes() == []


@pytest.mark.slow
def test_mfu_torch_compile_peer_on_cpu(tmp_path):
    """Both compiled variants on CPU (inductor's C++ backend): ~60 s on 2 cores."""
    proc, data = _mfu(tmp_path, "--peer", "torch-compile", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    names = [r["name"] for r in data["results"]]
    assert names == ["engine", "torch-compile bf16", "torch-compile amp"]
    for r in data["results"]:
        assert "error" not in r, r.get("error")
        assert r["flops_per_token"] == data["results"][0]["flops_per_token"]


@pytest.mark.slow  # ~9 s: matplotlib and two engine runs
def test_sweep_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    proc, data = _mfu(tmp_path, "--sweep", "--seqs", "16", "32", "--mbs", "1", "--png", str(png))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert [(p["seq"], p["mbs"]) for p in data["results"]] == [(16, 1), (32, 1)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Re-drawn from the JSON alone (the GPU image has no matplotlib), and a JSON that is no sweep is refused.
    again = tmp_path / "again.png"
    redraw = subprocess.run([sys.executable, "bench/mfu.py", "--plot", str(tmp_path / "mfu.json"), "--png", str(again)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert redraw.returncode == 0 and again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", redraw.stderr
    (tmp_path / "plain.json").write_text(json.dumps({"meta": {}, "results": [{"name": "engine", "mfu": 0.5}]}))
    refused = subprocess.run([sys.executable, "bench/mfu.py", "--plot", str(tmp_path / "plain.json")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "not sweep points" in refused.stderr


def test_torchtitan_stand_ins_change_nothing_but_the_missing_names():
    """torchtitan 0.3.x imports two torch 2.12 names; on an older torch (the GPU image has 2.11) the peer gets
    stand-ins that keep its work as it is, and anything that would change it is refused, not run otherwise."""
    from types import SimpleNamespace

    from bench.peers.titan import torch_compat

    calls = []

    def old_create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda"):  # torch 2.11's signature, abridged
        calls.append((mask_mod, B, H, Q_LEN, KV_LEN, device))
        return "mask"

    fsdp, flex = SimpleNamespace(), SimpleNamespace(create_block_mask=old_create_block_mask)
    assert torch_compat(fsdp, flex) == ["DataParallelMeshDims", "create_block_mask(separate_full_blocks)"]
    # torch < 2.12 always stores full blocks apart: True is what it does already, and is passed as nothing.
    assert flex.create_block_mask("causal", 2, None, 8, 8, device="cpu", separate_full_blocks=True) == "mask"
    assert calls == [("causal", 2, None, 8, 8, "cpu")]
    with pytest.raises(RuntimeError, match="separate_full_blocks=False"):
        flex.create_block_mask("causal", 2, None, 8, 8, separate_full_blocks=False)
    assert len(calls) == 1
    with pytest.raises(RuntimeError, match="multi-rank SPMD mesh"):
        fsdp.DataParallelMeshDims(shard="fsdp")
    # Installed once; a later call reports the same stand-ins (build_step picks its backend by them), and a
    # torch that has both names gets none.
    wrapped = flex.create_block_mask
    assert torch_compat(fsdp, flex) == ["DataParallelMeshDims", "create_block_mask(separate_full_blocks)"]
    assert flex.create_block_mask is wrapped

    def new_create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda", separate_full_blocks=True):
        return "mask"

    class DataParallelMeshDims:
        pass

    assert torch_compat(SimpleNamespace(DataParallelMeshDims=DataParallelMeshDims),
                        SimpleNamespace(create_block_mask=new_create_block_mask)) == []


@pytest.mark.slow  # two tiny CPU engine runs, one with --fp8 (the emulation)
def test_an_fp8_row_reports_mfu_against_both_peaks(tmp_path):
    """--fp8 rows: `mfu` against the bf16 peak (comparable with every earlier number) and `mfu_fp8_peak` against the
    FP8 dense peak, twice bf16's (engine/flops.py); other rows null. --peak-tflops gives CPU a peak."""
    proc, data = _mfu(tmp_path, "--variant", "bf16=", "--variant", "fp8=--fp8 tensorwise", "--peak-tflops", "1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    bf16, fp8 = data["results"]
    assert bf16["mfu_fp8_peak"] is None and bf16["mfu"] > 0
    assert fp8["mfu"] > 0 and fp8["mfu_fp8_peak"] == pytest.approx(fp8["mfu"] / 2, rel=1e-12)
    assert "MFU8" in proc.stdout and f"{fp8['mfu_fp8_peak']:.3f}" in proc.stdout


def test_the_table_shows_the_fp8_peak_mfu_only_for_fp8_rows(capsys):
    from bench.mfu import print_table
    row = {"kind": "engine", "name": "bf16", "device": "NVIDIA H200", "nproc": 1, "median_step_s": 1.0,
           "step_s_spread": [1.0, 1.0], "tokens_per_s": 1000.0, "mfu": 0.4, "final_loss": 3.0, "mfu_fp8_peak": None}
    print_table([row, {**row, "name": "fp8", "mfu": 0.5, "mfu_fp8_peak": 0.25}])
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line[:4] in ("bf16", "fp8 ")}
    # columns: run, GPUs, step s, spread, tok/s, MFU, MFU8, ...
    assert lines["bf16"][5:7] == ["0.400", "-"] and lines["fp8"][5:7] == ["0.500", "0.250"], lines


def test_a_variant_names_the_module_it_runs_as():
    """NAME@MODULE=FLAGS: a row run as `python -m MODULE pretrain` (an A/B against a reference module in one job)."""
    assert parse_variant("dp4=--tp 2") == ("dp4", "", "--tp 2")
    assert parse_variant("dp4-add@tests.engine.always_add=") == ("dp4-add", "tests.engine.always_add", "")
    assert parse_variant("x=--fp8 tensorwise --lr=1e-3") == ("x", "", "--fp8 tensorwise --lr=1e-3")
    with pytest.raises(SystemExit, match="NAME=FLAGS"):
        parse_variant("dp4")


@pytest.mark.slow  # two tiny CPU engine runs
def test_a_row_run_as_the_always_add_reference_trains_the_same_losses(tmp_path):
    """A row of one job run as tests.engine.always_add (the gradient buffer cleared every step, every gradient added):
    its command names the module, and on CPU its losses are the engine's bit for bit (tests/engine/always_add.py)."""
    proc, data = _mfu(tmp_path, "--variant", "engine=", "--variant", "always-add@tests.engine.always_add=")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    engine, always = data["results"]
    assert always["name"] == "always-add" and "tests.engine.always_add" in always["cmd"]
    assert "tests.engine.always_add" not in engine["cmd"]
    assert [s["loss"] for s in engine["steps"]] == [s["loss"] for s in always["steps"]]
