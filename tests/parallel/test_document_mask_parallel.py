"""--document-mask under TP 2, TP 2 + sequence parallelism and DP 2 (two real gloo processes) against one process.

Every rank finds the same document boundaries in its micro-batch (TP ranks read the same samples; under
sequence parallelism QKV is gathered to the whole sequence before attention), so the layouts compute the
masked model's sums in another order only. fp32 on CPU, tiny preset, a corpus of short documents (several
per 64-token window, so the mask acts in every step). Tolerances as tests/parallel/test_tp_dp_equivalence.py
(rel. 1e-5 for TP: row-parallel partial sums; 1e-6 for DP 2 against GAS 2: the same two micro-batch
gradients added in either order), for the logits of a batch holding EOS tokens, before and after 5 steps,
and for each step's loss and grad norm. The masked one-process run differs from the unmasked one, so the
comparisons exercise the mask.
"""

import pytest
import torch

from tests.engine.test_document_mask import short_documents
from tests.once import once_per_run
from tests.parallel.test_tp_dp_equivalence import assert_trajectories, tensor_rel
from tests.parallel.workers import single_run, spawn

STEPS = 5


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("short")
    short_documents(folder, 400, 1, "train")
    return {"hf_dataset": str(folder), "data_cache_dir": str(tmp_path_factory.mktemp("cache")), "eval_samples": 0}


@pytest.fixture(scope="session")
@once_per_run
def runs(tmp_path_factory, data):
    masked = {**data, "document_mask": True, "reset_position_ids": True}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned ranks: the same GEMM blocking
    try:  # the one-process runs prepare the data cache first; the ranks then read it
        single = {"masked": single_run(masked, STEPS), "plain": single_run(data, STEPS),
                  "gas2": single_run({**data, "document_mask": True, "micro_batch_size": 2, "grad_accum_steps": 2}, STEPS)}
    finally:
        torch.set_num_threads(threads)
    scenarios = [("tp2", {**masked, "tp": 2}, STEPS), ("tp2_sp", {**masked, "tp": 2, "sequence_parallel": True}, STEPS),
                 ("dp2", {**data, "document_mask": True, "micro_batch_size": 2}, STEPS)]
    return single, spawn(2, scenarios, tmp_path_factory.mktemp("world2"))


def test_the_mask_matters_on_this_data(runs):
    single, _ = runs
    assert single["masked"]["steps"][0][0] != single["plain"]["steps"][0][0]


@pytest.mark.parametrize("layout", ["tp2", "tp2_sp"])
def test_tensor_parallel_matches_one_process(runs, layout):
    single, world = runs
    got, want = world[layout], single["masked"]
    assert got["layout"] == (2, 1)
    assert tensor_rel(got["logits0"], want["logits0"]) < 1e-5
    assert_trajectories(got["steps"], want["steps"], 1e-5, f"{layout} with --document-mask")
    assert tensor_rel(got["logits"], want["logits"]) < 1e-5


def test_data_parallel_matches_gradient_accumulation(runs):
    single, world = runs
    assert world["dp2"]["layout"] == (1, 2)
    assert_trajectories(world["dp2"]["steps"], single["gas2"]["steps"], 1e-6, "dp2 vs gas2 with --document-mask")
