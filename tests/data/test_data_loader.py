"""Packing and batch dealing: determinism, DP/GAS equivalence, epochs, resume.

The token stream here is arange(N): token t is t, so a sample's first token names the sample
(sample i starts at token i * seq), and every check below is against that closed form rather than
against the loader's own arithmetic.
"""

import json

import pytest
import torch

from engine.data.loader import BatchLoader, PackedSamples, eval_batches
from engine.data.shards import InMemoryTokens
from engine.errors import ConfigError

SEQ = 8


def arange_tokens(n: int, name: str = "arange") -> InMemoryTokens:
    return InMemoryTokens(torch.arange(n), eos_id=0, vocab_size=n, tokenizer_name=name, num_bytes=n, num_documents=1,
                          description="arange")


def samples(n_tokens: int = 1001, seq: int = SEQ, name: str = "arange") -> PackedSamples:
    return PackedSamples(arange_tokens(n_tokens, name), seq)


def loader(s: PackedSamples, mbs=2, gas=1, rank=0, dp=1, seed=7) -> BatchLoader:
    return BatchLoader(s, micro_batch_size=mbs, grad_accum_steps=gas, dp_rank=rank, dp_size=dp, seed=seed)


def ids(step: list[tuple[torch.Tensor, torch.Tensor]]) -> list[list[int]]:
    """Sample indices of each micro-batch, read off the first input token (token i*SEQ starts sample i)."""
    return [(inputs[:, 0] // SEQ).tolist() for inputs, _ in step]


def test_packing_megatron_style():
    s = samples(1001)
    assert len(s) == (1001 - 1) // SEQ == 125
    for i in (0, 1, 57, 124):
        assert s[i].tolist() == list(range(i * SEQ, i * SEQ + SEQ + 1))
    assert s[3][-1] == s[4][0]  # consecutive samples share one token
    assert s[-1].tolist() == s[124].tolist()
    with pytest.raises(IndexError):
        s[125]
    inputs, labels = s.batch([5, 9])
    assert inputs.shape == labels.shape == (2, SEQ) and inputs.dtype == torch.int64
    assert torch.equal(labels, inputs + 1)  # labels are inputs shifted by one
    assert len(samples(1000)) == 124  # the last sample needs seq + 1 tokens


def test_same_seed_same_batches_and_different_seed_differs():
    s = samples()
    a, b, c = loader(s, seed=1), loader(s, seed=1), loader(s, seed=2)
    run_a = [ids(a.next_step()) for _ in range(150)]  # > 2 epochs of 62 steps
    assert run_a == [ids(b.next_step()) for _ in range(150)]
    assert run_a != [ids(c.next_step()) for _ in range(150)]


def test_dp2_gas1_equals_dp1_gas2():
    s = samples()
    dp = [loader(s, mbs=3, gas=1, rank=r, dp=2) for r in range(2)]
    gas = loader(s, mbs=3, gas=2, rank=0, dp=1)
    for _ in range(50):
        by_rank = [ids(l.next_step()) for l in dp]
        by_micro = ids(gas.next_step())
        assert by_micro == [by_rank[0][0], by_rank[1][0]]


def test_dp_ranks_disjoint_and_cover_the_global_batch():
    s = samples()
    mbs, gas, dp = 2, 3, 4  # global batch 24, 5 steps per epoch of 125 samples
    loaders = [loader(s, mbs=mbs, gas=gas, rank=r, dp=dp) for r in range(dp)]
    seen_epoch: list[int] = []
    for _ in range(loaders[0].steps_per_epoch):
        rows = loaders[0].global_rows()
        per_rank = [[i for micro in ids(l.next_step()) for i in micro] for l in loaders]
        flat = [i for r in per_rank for i in r]
        assert len(set(flat)) == len(flat) == mbs * gas * dp  # disjoint within the step
        assert sorted(flat) == sorted(rows)
        seen_epoch += flat
    assert len(set(seen_epoch)) == len(seen_epoch) == 5 * 24  # no sample twice in an epoch; tail of 5 dropped


def test_epoch_wraps_with_a_new_order_and_full_batches():
    s = samples()
    l = loader(s, mbs=5, gas=2)
    assert l.steps_per_epoch == 12  # 125 // 10
    first = [i for _ in range(12) for micro in ids(l.next_step()) for i in micro]
    assert l.epoch == 0 and l.consumed_samples == 120
    second = [i for _ in range(12) for micro in ids(l.next_step()) for i in micro]
    assert l.epoch == 1 and l.consumed_samples == 240
    assert first != second and len(set(second)) == 120  # reshuffled, still no repeats within the epoch
    assert first != sorted(first)  # a real shuffle, not dataset order
    for step in (l.next_step() for _ in range(30)):
        assert all(inputs.shape == (5, SEQ) for inputs, _ in step)


def test_state_dict_resume_is_identical_to_uninterrupted():
    s = samples()
    for k in (0, 1, 11, 12, 13, 40):  # 12 steps per epoch: before, at and after epoch boundaries
        reference = loader(s, mbs=5, gas=2)
        expected = [reference.next_step() for _ in range(k + 15)][k:]
        first = loader(s, mbs=5, gas=2)
        for _ in range(k):
            first.next_step()
        state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as plain data
        resumed = loader(s, mbs=5, gas=2)
        resumed.load_state_dict(state)
        for want in expected:
            got = resumed.next_step()
            assert all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(got, want))


def test_resume_on_another_layout_with_the_same_global_batch():
    s = samples()
    dp = [loader(s, mbs=3, gas=1, rank=r, dp=2) for r in range(2)]
    for _ in range(7):
        for l in dp:
            l.next_step()
    gas = loader(s, mbs=3, gas=2, rank=0, dp=1)
    gas.load_state_dict(dp[0].state_dict())
    assert ids(gas.next_step()) == [ids(l.next_step())[0] for l in dp]


def test_mismatched_resume_raises():
    s = samples()
    state = loader(s).state_dict()
    with pytest.raises(ConfigError, match="fingerprint") as err:  # other --seq-length (the trainer names the flag
        loader(samples(seq=SEQ + 1)).load_state_dict(state)        # first: checkpoint.STATE_FIELDS)
    assert str(err.value).startswith(f"this run's data (") and f"of --seq-length {SEQ + 1}, fingerprint" in str(err.value)
    assert "is not the data of the checkpoint it resumes" in str(err.value) and "--resume=" not in str(err.value)
    with pytest.raises(ConfigError, match="fingerprint"):
        loader(samples(name="other-tokenizer")).load_state_dict(state)  # same numbers, other tokenizer
    with pytest.raises(ConfigError, match="fingerprint"):
        loader(PackedSamples(InMemoryTokens(torch.arange(1001).flip(0), eos_id=0, vocab_size=1001, tokenizer_name="arange",
                                            num_bytes=1, num_documents=1, description=""), SEQ)).load_state_dict(state)
    with pytest.raises(ConfigError) as err:
        loader(s, seed=8).load_state_dict(state)
    assert err.value.field == "--seed"
    with pytest.raises(ConfigError) as err:
        loader(s, mbs=4).load_state_dict(state)
    assert err.value.field == "--global-batch-size"


def test_too_few_samples_for_one_global_batch():
    s = samples(100)  # 12 samples
    loader(s, mbs=4, gas=3)  # exactly one step fits
    with pytest.raises(ConfigError) as err:
        loader(s, mbs=4, gas=2, dp=2)
    msg = str(err.value)
    assert err.value.field == "--global-batch-size" and "--seq-length" in msg and "only 12" in msg


def test_eval_batches_fixed_disjoint_and_layout_independent():
    """The first N samples whatever mbs and DP: sample i on DP rank i % dp, micro-batches of up to mbs."""
    s = samples()
    def rows(n, mbs, dp):
        return [[(x[:, 0] // SEQ).tolist() for x, _ in eval_batches(s, num_samples=n, micro_batch_size=mbs, dp_rank=r,
                                                                       dp_size=dp)] for r in range(dp)]
    assert rows(7, 2, 2) == [[[0, 2], [4, 6]], [[1, 3], [5]]]
    assert rows(7, 4, 1) == [[[0, 1, 2, 3], [4, 5, 6]]]
    for mbs, dp in ((1, 1), (2, 1), (3, 2), (1, 4), (8, 8)):
        covered = sorted(i for rank in rows(7, mbs, dp) for batch in rank for i in batch)
        assert covered == list(range(7)), (mbs, dp)
    with pytest.raises(ConfigError) as err:
        list(eval_batches(s, num_samples=len(s) + 1, micro_batch_size=10, dp_rank=0, dp_size=2))
    assert err.value.field == "--eval-samples" and f"at most {len(s)}" in str(err.value)
