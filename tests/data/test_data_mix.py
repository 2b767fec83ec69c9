"""--data-mix (issue 14): prepared datasets sampled by weight, deterministic, resumable, with an anneal.

Three real folders of `engine prepare` (byte tokenizer) whose texts use disjoint alphabets, so the source of
every trained row is read from its tokens, not from the loader's bookkeeping. References:
- mixture fractions: the count of rows of each source over n draws is Binomial(n, w); asserted within 4
  standard deviations (the draws are seeded, so this is deterministic; 4 sigma is the bound the weights must
  meet for any seed but about 1 in 16,000);
- resume: a loader restored from another's state (through JSON, as a checkpoint keeps it) hands out the same
  rows from then on, and a resumed `pretrain` prints the same [LOSS] and [MIX] lines as the uninterrupted run;
- anneal: with --data-mix web:1,code:0 and --data-mix-anneal code:1 at 0.5 of 10 steps, steps 1-5 are all web
  and steps 6-10 all code;
- DP 2: the two ranks' micro-batches of a step are disjoint and together are the single-process global batch;
- `engine batches` (what the judge replays) states the rows the trainer trained on: its per-source counts
  equal the [MIX] token counts of a real run.
"""

import json
import random
from pathlib import Path

import pytest
import torch

from engine.config import build_config, resolve
from engine.data.mix import MixLoader
from engine.data.prepare import prepare_from_config
from engine.data.sources import build_data
from engine.errors import ConfigError
from tests.engine.helpers import loss_lines, run_engine, run_engine_batch

SEQ = 32
ALPHABETS = {"web": "abcdefgh", "code": "{}();=+-", "math": "0123456789"}


def source_of(row: list[int]) -> str:
    """The source whose alphabet the row's tokens (bytes; 257 is EOS) are drawn from."""
    chars = {chr(t) for t in row if t < 256}
    found = [name for name, letters in ALPHABETS.items() if chars <= set(letters)]
    assert len(found) == 1, (chars, found)
    return found[0]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    rng = random.Random(0)
    out = {}
    for name, letters in ALPHABETS.items():
        files = {}
        for split, n in (("train", 150), ("validation", 20)):
            files[split] = root / f"{name}-{split}.jsonl"
            files[split].write_text("".join(json.dumps({"text": "".join(rng.choice(letters) for _ in range(120))}) + "\n"
                                            for _ in range(n)))
        cfg = build_config({"hf_dataset": str(files["train"]), "hf_val_dataset": str(files["validation"])})
        prepare_from_config(cfg, out_dir=root / name, progress=False)
        out[name] = str(root / name)
    return out


def mix_cfg(folders, mix: str, world: int = 1, **kw):
    spec = ",".join(f"{folders[name]}:{w}" for name, w in (p.split(":") for p in mix.split(",")))
    if "data_mix_anneal" in kw:
        kw["data_mix_anneal"] = ",".join(f"{folders[n]}:{w}" for n, w in (p.split(":") for p in kw["data_mix_anneal"].split(",")))
    return resolve(build_config({"preset": "tiny", "seq_length": SEQ, "micro_batch_size": 4, "eval_samples": 4,
                                 "data_mix": spec, **kw}), world)


def loader_for(cfg, dp_rank=0, dp_size=1, data=None) -> MixLoader:
    data = data or build_data(cfg, cache_dir=Path("/nonexistent"), dp_rank=0, dp_size=1)
    return MixLoader(data.train, micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps,
                     dp_rank=dp_rank, dp_size=dp_size, seed=cfg.seed)


def sources_of_step(loader: MixLoader) -> list[str]:
    return [source_of(r) for x, _ in loader.next_step() for r in x.tolist()]


def test_mixture_fractions_are_the_weights_within_binomial_tolerance(folders):
    cfg = mix_cfg(folders, "web:5,code:3,math:2", micro_batch_size=64)
    loader = loader_for(cfg)
    drawn = [s for _ in range(50) for s in sources_of_step(loader)]  # 3200 rows: more than the sources hold
    n = len(drawn)
    for name, p in (("web", 0.5), ("code", 0.3), ("math", 0.2)):
        sigma = (n * p * (1 - p)) ** 0.5
        assert abs(drawn.count(name) - n * p) < 4 * sigma, (name, drawn.count(name), n * p, sigma)
    assert loader.tokens_by_source() == {folders[k]: drawn.count(k) * SEQ for k in ALPHABETS}


def test_same_seed_same_rows_another_seed_other_rows(folders):
    cfg = mix_cfg(folders, "web:1,code:1")
    first, second, other = loader_for(cfg), loader_for(cfg), loader_for(mix_cfg(folders, "web:1,code:1", seed=7))
    a = [first.next_global_rows() for _ in range(20)]
    assert a == [second.next_global_rows() for _ in range(20)]
    assert a != [other.next_global_rows() for _ in range(20)]


def test_a_restored_loader_continues_the_same_sequence(folders):
    cfg = mix_cfg(folders, "web:3,code:1,math:1", micro_batch_size=16)
    whole, part = loader_for(cfg), loader_for(cfg)
    rows = [whole.next_global_rows() for _ in range(40)]  # several epochs of each source
    for _ in range(23):
        part.next_global_rows()
    restored = loader_for(cfg)
    restored.load_state_dict(json.loads(json.dumps(part.state_dict())))
    assert [restored.next_global_rows() for _ in range(17)] == rows[23:]
    assert restored.tokens_by_source() == whole.tokens_by_source()
    other = loader_for(mix_cfg(folders, "web:1,code:1,math:1", micro_batch_size=16))
    with pytest.raises(ConfigError) as err:  # another mix: a sentence about the mix, not "--data-mix='' ..."
        other.load_state_dict(part.state_dict())
    assert str(err.value).startswith("this run's --data-mix (fingerprint ") and "is not the mix of the checkpoint" in str(err.value)


def test_the_anneal_switches_at_its_step(folders):
    cfg = mix_cfg(folders, "web:1,code:0", num_steps=10, data_mix_anneal="code:1", data_mix_anneal_at=0.5)
    loader = loader_for(cfg)
    steps = [set(sources_of_step(loader)) for _ in range(10)]
    assert steps == [{"web"}] * 5 + [{"code"}] * 5


def test_dp_ranks_read_disjoint_rows_that_cover_the_batch(folders):
    single = mix_cfg(folders, "web:2,code:1", micro_batch_size=2, grad_accum_steps=4)
    dp2 = mix_cfg(folders, "web:2,code:1", world=2, micro_batch_size=2, grad_accum_steps=2)
    assert single.global_batch_size == dp2.global_batch_size == 8
    data = build_data(single, cache_dir=Path("/nonexistent"), dp_rank=0, dp_size=1)
    whole = loader_for(single, data=data)
    ranks = [loader_for(dp2, r, 2, data=data) for r in range(2)]
    for _ in range(12):
        rows = whole.next_global_rows()
        fed = [[tuple(r) for x, _ in loader.next_step() for r in x.tolist()] for loader in ranks]
        want = sorted(tuple(r) for r in data.train.batch(rows)[0].tolist())
        assert len(fed[0]) == len(fed[1]) == 4 and sorted(fed[0] + fed[1]) == want


def test_resumed_run_and_engine_batches_follow_the_mix(folders, tmp_path):
    mix = f"{folders['web']}:0.6,{folders['code']}:0.4"
    args = ["--preset", "tiny", "--device", "cpu", "--seq-length", str(SEQ), "--micro-batch-size", "4", "--eval-samples", "4",
            "--num-steps", "6", "--warmup-steps", "2", "--data-mix", mix, "--data-mix-anneal", f"{folders['code']}:1", "--data-mix-anneal-at", "0.5"]
    whole = run_engine("pretrain", *args, "--save-every", "2", "--run-dir", str(tmp_path / "a")).stdout
    # the resume and `engine batches` in one process (tests/engine/engine_batch.py), the resume first: nothing it leaves
    # behind can make the stated batches match the first run's source counts below unless they are right
    resumed, batches = run_engine_batch([
        ["pretrain", *args, "--resume", str(tmp_path / "a" / "checkpoints" / "step_00000002"),
         "--run-dir", str(tmp_path / "b")],
        ["batches", *args, "--steps", "1-6", "--out", str(tmp_path / "batches")]])
    assert resumed.returncode == 0 and batches.returncode == 0, resumed.stderr[-3000:] + batches.stderr[-3000:]
    resumed = resumed.stdout

    def lines(out: str) -> list[str]:
        return [" ".join(x.split()[:3]) if x.startswith("[LOSS]") else x for x in out.splitlines()
                if x.startswith(("[LOSS]", "[MIX]"))]  # [LOSS] without time and MFU: step, loss, grad norm

    assert lines(resumed) == lines(whole)[4:] and len(lines(whole)) == 12
    doc = json.loads((tmp_path / "batches" / "batches.json").read_text())
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    counts = {folders["web"]: 0, folders["code"]: 0}
    for step, record in enumerate((r for r in records if r["kind"] == "loss"), 1):
        for row in doc["steps"][str(step)]["inputs"]:
            counts[folders[source_of(row)]] += SEQ
        assert record["source_tokens"] == counts, step
    assert f"[MIX] step=6 tokens {folders['web']}={counts[folders['web']]} {folders['code']}={counts[folders['code']]}" in whole
    assert {source_of(r) for s in ("4", "5", "6") for r in doc["steps"][s]["inputs"]} == {"code"}
    assert loss_lines(whole)


@pytest.mark.parametrize("overrides,field,fragment", [
    ({"data_mix": "data/web"}, "--data-mix", "has a bad part 'data/web'"),
    ({"data_mix": "data/web:0.5,data/code:x"}, "--data-mix", "has a bad part 'data/code:x'"),
    ({"data_mix": "data/web:-1"}, "--data-mix", "has a bad part 'data/web:-1'"),
    ({"data_mix": "data/web:inf"}, "--data-mix", "has a bad part 'data/web:inf'"),
    ({"data_mix": ":1"}, "--data-mix", "has a bad part ':1'"),
    ({"data_mix": "a:1,,b:1"}, "--data-mix", "has a bad part ''"),
    ({"data_mix": "a:1,a:2"}, "--data-mix", "names 'a' twice"),
    ({"data_mix": "a:0,b:0"}, "--data-mix", "all 0"),
    ({"data_mix": "a:1,b:1", "data_mix_anneal": "c:1"}, "--data-mix-anneal", "names 'c', which --data-mix does not"),
    ({"data_mix": "a:1,b:1", "data_mix_anneal": "b:1", "data_mix_anneal_at": 1.0}, "--data-mix-anneal-at", "(0, 1)"),
    ({"data_mix_anneal": "b:1"}, "--data-mix-anneal", "has no --data-mix"),
    ({"data_mix": "a:1", "data_path": "data/x"}, "--data-path", "contradicts --data-mix"),
    ({"data_mix": "a:1,b:1", "data_mix_anneal": "b:1", "max_wall_s": 60.0, "lr_schedule": "constant"},
     "--data-mix-anneal", "known last step"),
])
def test_bad_mix_specs_name_the_bad_part(overrides, field, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(build_config(overrides))
    assert info.value.field == field and fragment in str(info.value), str(info.value)


def test_a_missing_folder_is_named(folders, tmp_path):
    cfg = resolve(build_config({"preset": "tiny", "seq_length": SEQ, "data_mix": f"{folders['web']}:1,{tmp_path / 'nope'}:1"}))
    with pytest.raises(ConfigError, match=r"names '.*nope', which has no prepared train/ split"):
        build_data(cfg, cache_dir=tmp_path, dp_rank=0, dp_size=1)
