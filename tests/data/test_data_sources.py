"""build_data: embedded corpus (torch only), prepared folders, on-the-fly preparation and its cache,
rank coordination through files, and the config errors."""

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.data.embedded import CORPUS_DIR, read_embedded
from engine.data.format import COMPLETE_FILE, INDEX_FILE
from engine.data.prepare import prepare_from_config
from engine.data.sources import build_data, cache_key
from engine.data.tokenizer import ByteTokenizer
from engine.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def cfg_for(**kw) -> EngineConfig:
    return dataclasses.replace(EngineConfig(), **kw)


def stream_of(texts: list[str], eos: int = 257) -> list[int]:
    out: list[int] = []
    for t in texts:
        out += list(t.encode("utf-8")) + [eos]
    return out


def all_tokens(samples) -> list[int]:
    return samples.shards.tokens(0, samples.shards.num_tokens).tolist()


# --- embedded corpus -----------------------------------------------------------------------------


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('datasets', 'tokenizers', 'sentencepiece', 'pyarrow', 'transformers'):
            raise ImportError(f'{name} is blocked: the embedded path must not need it')
sys.meta_path.insert(0, Block())
"""


def test_embedded_path_needs_only_torch(tmp_path, run_python):
    """In a fresh interpreter where datasets / tokenizers / sentencepiece / pyarrow cannot even be
    imported, the default config builds its data, and none of them is in sys.modules afterwards."""
    code = BLOCKER + f"""
from pathlib import Path
from engine.config import EngineConfig
from engine.data.sources import build_data
from engine.data.loader import BatchLoader
b = build_data(EngineConfig(), cache_dir=Path({str(tmp_path)!r}), dp_rank=0, dp_size=1)
BatchLoader(b.train, micro_batch_size=8, grad_accum_steps=1, dp_rank=0, dp_size=1, seed=1).next_step()
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('datasets', 'tokenizers', 'sentencepiece', 'pyarrow'))
print(repr((heavy, len(b.train), len(b.validation), b.tokenizer.name)))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    heavy, n_train, n_val, name = eval(result.stdout.strip().splitlines()[-1])
    assert heavy == [] and name == "bytes-258" and n_train > 2000 and n_val > 200
    assert list(tmp_path.iterdir()) == []  # the embedded corpus is tokenized in memory


def test_embedded_bundle_tokens():
    bundle = build_data(cfg_for(), cache_dir=Path("/nonexistent-never-used"), dp_rank=0, dp_size=1)
    assert isinstance(bundle.tokenizer, ByteTokenizer)
    for split, samples in (("train", bundle.train), ("validation", bundle.validation)):
        texts = [r["text"] for r in read_embedded(split)]
        assert all_tokens(samples) == stream_of(texts)
        assert samples.shards.num_bytes == sum(len(t.encode()) for t in texts)
        assert samples.seq_length == 256
    assert "embedded corpus" in bundle.description and "validation" in bundle.description


def test_embedded_corpus_is_small_and_true_to_its_source(shared_data):
    pq = pytest.importorskip("pyarrow.parquet")
    sizes = {p.name: p.stat().st_size for p in CORPUS_DIR.iterdir()}
    assert sum(sizes.values()) < 1_000_000
    assert 550_000 < sizes["train.jsonl"] < 700_000 and 50_000 < sizes["validation.jsonl"] < 80_000
    corpus = shared_data / "corpus"
    for split, files in (("train", ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]),
                         ("validation", ["validation-00000-of-00001.parquet"])):
        by_source = {r["source"]: r for f in files for r in pq.read_table(corpus / f).to_pylist()}
        for record in read_embedded(split):
            assert by_source[record["source"]] == record  # byte-identical, and from the same split


# --- prepared folder (--data-path) ---------------------------------------------------------------


@pytest.fixture
def prepared(tmp_path, write_jsonl) -> Path:
    src = tmp_path / "src"
    write_jsonl(src / "train.jsonl", [{"text": f"training document number {i}. " * 30} for i in range(40)])
    write_jsonl(src / "validation.jsonl", [{"text": f"held-out text {i}. " * 30} for i in range(10)])
    return prepare_from_config(cfg_for(hf_dataset=str(src)), out_dir=tmp_path / "prepared", progress=False)


def test_data_path(prepared):
    bundle = build_data(cfg_for(data_path=str(prepared), seq_length=64), cache_dir=Path("/unused"), dp_rank=0, dp_size=1)
    assert isinstance(bundle.tokenizer, ByteTokenizer)
    assert bundle.train.seq_length == 64 and bundle.validation is not None
    assert all_tokens(bundle.train) == stream_of([f"training document number {i}. " * 30 for i in range(40)])
    assert str(prepared) in bundle.description


def test_data_path_with_another_tokenizer(prepared, tmp_path, minicpm_dir):
    pytest.importorskip("sentencepiece")
    with pytest.raises(ConfigError, match="not the shards'") as err:
        build_data(cfg_for(data_path=str(prepared), tokenizer_path=str(minicpm_dir), vocab_size=73448), cache_dir=tmp_path,
                   dp_rank=0, dp_size=1)
    assert err.value.field == "--tokenizer-path"


def test_data_path_errors(prepared, tmp_path):
    base = cfg_for(data_path=str(prepared))
    with pytest.raises(ConfigError, match="pass --vocab-size 258") as err:
        build_data(dataclasses.replace(base, vocab_size=100), cache_dir=tmp_path, dp_rank=0, dp_size=1)
    assert err.value.field == "--vocab-size"
    with pytest.raises(ConfigError, match="has no prepared train/"):
        build_data(cfg_for(data_path=str(tmp_path / "nothing")), cache_dir=tmp_path, dp_rank=0, dp_size=1)
    # Validation missing: fine with --eval-samples 0, an error naming the fix otherwise.
    import shutil
    shutil.rmtree(prepared / "validation")
    assert build_data(dataclasses.replace(base, eval_samples=0), cache_dir=tmp_path, dp_rank=0, dp_size=1).validation is None
    with pytest.raises(ConfigError, match="--eval-samples 0") as err:
        build_data(base, cache_dir=tmp_path, dp_rank=0, dp_size=1)
    assert err.value.field == "--data-path"


def test_corrupt_or_incomplete_shards(prepared, tmp_path):
    train = prepared / "train"
    index = json.loads((train / INDEX_FILE).read_text())
    shard = train / index["shards"][0]["file"]
    data = shard.read_bytes()
    cfg = cfg_for(data_path=str(prepared))

    def expect(problem: str) -> None:
        with pytest.raises(ConfigError, match=problem) as err:
            build_data(cfg, cache_dir=tmp_path, dp_rank=0, dp_size=1)
        assert err.value.field == "--data-path" and str(train) in str(err.value) and "python -m engine prepare" in str(err.value)

    shard.write_bytes(data[:-2])
    expect("has 2 bytes|index.json says")
    shard.unlink()
    expect("is missing")
    shard.write_bytes(data)
    (train / INDEX_FILE).write_text("{ truncated")
    expect("corrupt index.json")
    (train / INDEX_FILE).write_text(json.dumps({**index, "version": 99}))
    expect("format version 99")
    (train / INDEX_FILE).write_text(json.dumps({k: v for k, v in index.items() if k != "num_tokens"}))
    expect("incomplete index.json")
    (train / INDEX_FILE).unlink()
    with pytest.raises(ConfigError, match="has no prepared train/.*python -m engine prepare --out") as err:
        build_data(cfg, cache_dir=tmp_path, dp_rank=0, dp_size=1)
    assert err.value.field == "--data-path"


def test_verify_detects_flipped_bytes(prepared):
    from engine.data.shards import TokenShards

    train = prepared / "train"
    shard = train / "tokens-00000.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    TokenShards(train)  # sizes still match: only the hash can tell
    with pytest.raises(ConfigError, match="sha256"):
        TokenShards(train, verify=True)


# --- --hf-dataset prepared on the fly ------------------------------------------------------------


@pytest.fixture
def source(tmp_path, write_jsonl) -> Path:
    src = tmp_path / "ds"
    write_jsonl(src / "train-00000.jsonl", [{"title": f"T{i}", "text": f"body of document {i} " * 20} for i in range(30)])
    write_jsonl(src / "validation-00000.jsonl", [{"title": "V", "text": "validation body " * 20}])
    return src


def test_hf_dataset_prepared_once_and_reused(source, tmp_path):
    cfg = cfg_for(hf_dataset=str(source), seq_length=32, eval_samples=8)  # the validation split holds 10 samples
    cache = tmp_path / "cache"
    first = build_data(cfg, cache_dir=cache, dp_rank=0, dp_size=1)
    (folder,) = list(cache.iterdir())
    assert folder.name == cache_key(cfg, ByteTokenizer()) and (folder / COMPLETE_FILE).is_file()
    stamp = (folder / "train" / INDEX_FILE).stat().st_mtime_ns
    second = build_data(cfg, cache_dir=cache, dp_rank=0, dp_size=1)
    assert (folder / "train" / INDEX_FILE).stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert second.train.fingerprint == first.train.fingerprint
    texts = [f"body of document {i} " * 20 for i in range(30)]
    assert all_tokens(first.train) == stream_of(texts)
    # A template, or an edited file, is a different preparation.
    templated = dataclasses.replace(cfg, hf_text_template="{title}\n{text}")
    assert cache_key(templated, ByteTokenizer()) != folder.name
    time.sleep(0.01)
    (source / "validation-00000.jsonl").write_text(json.dumps({"title": "V", "text": "changed"}) + "\n")
    assert cache_key(cfg, ByteTokenizer()) != folder.name


def test_hf_dataset_validation_required_unless_eval_off(tmp_path, write_jsonl):
    src = tmp_path / "only-train"
    write_jsonl(src / "train.jsonl", [{"text": "some text " * 50}])
    with pytest.raises(ConfigError, match="--eval-samples 0") as err:
        build_data(cfg_for(hf_dataset=str(src), seq_length=16), cache_dir=tmp_path / "c", dp_rank=0, dp_size=1)
    assert err.value.field == "--hf-val-split"
    bundle = build_data(cfg_for(hf_dataset=str(src), seq_length=16, eval_samples=0), cache_dir=tmp_path / "c",
                        dp_rank=0, dp_size=1)
    assert bundle.validation is None and len(bundle.train) > 0


RANK = """
import sys
from pathlib import Path
from engine.config import EngineConfig
from engine.data.sources import build_data
cfg = EngineConfig(hf_dataset={src!r}, hf_text_field={field!r}, seq_length=32, eval_samples=8)
b = build_data(cfg, cache_dir=Path({cache!r}), dp_rank={rank}, dp_size=2, wait_timeout_s=120)
print('FINGERPRINT', b.train.fingerprint, b.validation.fingerprint)
"""


def spawn_rank(rank: int, src: Path, cache: Path, field: str = "text") -> subprocess.Popen:
    code = RANK.format(src=str(src), cache=str(cache), rank=rank, field=field)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rank_one_waits_for_rank_zero(source, tmp_path):
    cache = tmp_path / "cache"
    waiter = spawn_rank(1, source, cache)  # started first: must wait, not prepare
    time.sleep(0.5)
    preparer = spawn_rank(0, source, cache)
    outs = [p.communicate(timeout=180) for p in (preparer, waiter)]
    for p, (out, err) in zip((preparer, waiter), outs):
        assert p.returncode == 0, err[-3000:]
    prints = [next(line for line in out.splitlines() if line.startswith("FINGERPRINT")) for out, _ in outs]
    assert prints[0] == prints[1]
    assert "prepare train" in outs[0][1] and "prepare train" not in outs[1][1]  # only rank 0 tokenized


def test_rank_zero_failure_reaches_waiting_ranks(source, tmp_path):
    cache = tmp_path / "cache"
    waiter = spawn_rank(1, source, cache, field="body")
    preparer = spawn_rank(0, source, cache, field="body")
    start = time.monotonic()
    (_, err0), (_, err1) = preparer.communicate(timeout=180), waiter.communicate(timeout=180)
    assert preparer.returncode != 0 and "--hf-text-field='body'" in err0
    assert waiter.returncode != 0 and "could not be prepared by rank 0" in err1 and "--hf-text-field" in err1
    assert time.monotonic() - start < 100  # well before the 120 s wait timeout


def test_waiting_rank_times_out_with_a_fix(source, tmp_path):
    with pytest.raises(ConfigError, match="within 1 s") as err:
        build_data(cfg_for(hf_dataset=str(source)), cache_dir=tmp_path / "cache", dp_rank=1, dp_size=2, wait_timeout_s=1)
    assert err.value.field == "--data-cache-dir" and "--data-path" in str(err.value)


def test_vocab_checked_on_every_path(tmp_path, source, minicpm_dir):
    pytest.importorskip("sentencepiece")
    for extra in ({}, {"hf_dataset": str(source)}):
        with pytest.raises(ConfigError, match="pass --vocab-size 73448") as err:
            build_data(cfg_for(tokenizer_path=str(minicpm_dir), vocab_size=258, **extra), cache_dir=tmp_path / "c",
                       dp_rank=0, dp_size=1)
        assert err.value.field == "--vocab-size"
    assert not (tmp_path / "c").exists()


def test_embedded_with_minicpm4_tokenizer(tmp_path, minicpm_dir):
    spm = pytest.importorskip("sentencepiece")
    bundle = build_data(cfg_for(tokenizer_path=str(minicpm_dir), vocab_size=73448, seq_length=128), cache_dir=tmp_path,
                        dp_rank=0, dp_size=1)
    sp = spm.SentencePieceProcessor(model_file=str(minicpm_dir / "tokenizer.model"))
    ref = [i for r in read_embedded("validation") for i in sp.encode(r["text"]) + [2]]
    assert all_tokens(bundle.validation) == ref
