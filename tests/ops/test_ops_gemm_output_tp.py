"""Vocab-parallel gemm_output with TP=2 (two real processes, gloo) equals the TP=1 result.

Tolerance 1e-6 relative (loss; grads normwise): everything is fp32 and the math is the same; TP only
changes the order in which per-shard sum-exps are added and rescales each by exp(local max - global
max), a few fp32 ulps (~1e-7) per row.
"""

import torch

from engine.ops.gemm_output.baseline import gemm_output_chunked
from tests.ops import ops_tp_worker
from tests.parallel.workers import launch


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_tp2_matches_tp1(tmp_path):
    world = 2
    launch(ops_tp_worker.run_rank, (world, str(tmp_path / "store"), str(tmp_path)), world)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]

    for name, (_, _, v_padded, vocab_size, chunk) in ops_tp_worker.SCENARIOS.items():
        h, w, labels = ops_tp_worker.make_inputs(name)
        h.requires_grad_()
        w.requires_grad_()
        loss = gemm_output_chunked(h, w, labels, vocab_start=0, vocab_size=vocab_size, chunk_tokens=chunk)
        loss.backward()

        v_local = v_padded // world
        for r, res in enumerate(ranks):
            got = res[name]
            assert abs(got["loss"].item() - loss.item()) <= 1e-6 * abs(loss.item()), (name, r)
            assert _rel(got["grad_h"], h.grad) <= 1e-6, (name, r)
            want_w = w.grad[r * v_local:(r + 1) * v_local]
            if torch.count_nonzero(want_w):
                assert _rel(got["grad_w_shard"], want_w) <= 1e-6, (name, r)
            else:  # an all-padding shard: exactly zero, like the TP=1 rows it stands for
                assert torch.count_nonzero(got["grad_w_shard"]) == 0, (name, r)
