"""The `torchao-fp8` peer of bench/mfu.py (issue 32's bar for --fp8): the torch-compile loop on bf16 weights with
torchao's float8 training linears, on CPU (torchao's float8 path runs torch._scaled_mm there too).

What must hold for its tokens/s to mean "torchao float8 on the same model": the decoder's four linears of every layer
are torchao's Float8Linear and the LM head is not (the engine's --fp8 scope), the weights are the bf16 loop's own
(same seed, same initial values), and the step trains. Tolerance of the first step's loss against the bf16 loop's:
both start from the same weights and batch, so they differ only by FP8 rounding of the linears' operands (E4M3: 3
mantissa bits, 6 % per element, averaging out over the K-long dot products and the tokens of the loss): measured
1.4e-5 (tensorwise) and 1.2e-5 (rowwise) relative on the tiny preset; 1e-3 leaves room for other BLAS orders, and
a peer that silently kept bf16 (difference exactly 0) is named by the first assertion's `> 0`."""

import json

import pytest
import torch

pytest.importorskip("torchao.float8", reason="torchao (the dev extra) runs this peer")

from bench.peers.common import engine_config  # noqa: E402
from bench.peers.compiled import build_step  # noqa: E402

TINY = ["--preset", "tiny", "--seq-length", "64", "--micro-batch-size", "2", "--grad-accum-steps", "2", "--device", "cpu"]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_decoder_linears_run_torchaos_float8_and_the_loss_follows_bf16(recipe):
    from torchao.float8.float8_linear import Float8Linear

    cfg = engine_config(TINY, 1)
    bf16, bf16_step = build_step(cfg, "bf16", torch.device("cpu"), compile_model=False)
    fp8, fp8_step = build_step(cfg, "bf16", torch.device("cpu"), compile_model=False, fp8=recipe)
    for layer in fp8.layers:
        assert all(isinstance(m, Float8Linear) for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down))
    assert type(fp8.lm_head) is torch.nn.Linear
    assert all(torch.equal(a, b) for a, b in zip(bf16.parameters(), fp8.parameters()))  # the same initial weights
    ref, got = [bf16_step() for _ in range(3)], [fp8_step() for _ in range(3)]
    assert 0 < abs(got[0] - ref[0]) / ref[0] < 1e-3
    assert got[2] < got[0]


def test_a_torchao_row_says_its_version_and_its_fp8_mfu(tmp_path):
    """bench/peers/run.py end to end, as bench/mfu.py launches it: the row's name, torchao's version, an MFU8 field."""
    from bench.peers.run import main as run_peer

    out = tmp_path / "peer.json"
    code = run_peer(["--peer", "torchao-fp8", "--variant", "rowwise", "--layout", "compile=off", "--device", "cpu",
                     "--steps", "1", "--warmup", "0", "--out", str(out), "--", *TINY])
    row = json.loads(out.read_text())
    assert code == 0, row.get("traceback")
    assert row["name"] == "torchao-fp8 rowwise" and row["versions"]["torchao"] not in ("", "absent")
    assert "mfu_fp8_peak" in row and row["final_loss"] > 0
