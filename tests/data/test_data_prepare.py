"""`prepare`: real corpus and jsonl sources, index contents, atomicity, and user errors."""

import dataclasses
import hashlib
import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.data.format import INDEX_FILE
from engine.data.prepare import is_local_source, prepare_from_config, prepare_split, resolve_local_splits
from engine.data.shards import TokenShards
from engine.data.tokenizer import ByteTokenizer, load_tokenizer
from engine.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _datasets():
    """Every test here reads through HF datasets: imported by the first test, not at collection (~1.5 s that every
    xdist worker would pay)."""
    pytest.importorskip("datasets")


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under folder -> (sha256, mtime_ns): proof that nothing changed."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def prep(tmp_path: Path, source, split="train", field="text", template="", tokenizer=None, out="out", **kw) -> Path:
    return prepare_split(source=str(source), config_name="", split=split, text_field=field, text_template=template,
                         tokenizer=tokenizer or ByteTokenizer(), out_dir=tmp_path / out, progress=False, **kw)


def stream_of(texts: list[str], eos: int = 257) -> list[int]:
    """Independent reference of a byte-tokenized split: UTF-8 bytes of each document, then EOS."""
    out: list[int] = []
    for t in texts:
        out += list(t.encode("utf-8")) + [eos]
    return out


def all_tokens(split: Path) -> list[int]:
    shards = TokenShards(split)
    return shards.tokens(0, shards.num_tokens).tolist()


# --- real corpus ---------------------------------------------------------------------------------


def test_real_corpus_validation_split(shared_data, tmp_path, validation_records):
    spm = pytest.importorskip("sentencepiece")
    tok = load_tokenizer(str(shared_data / "tokenizers" / "minicpm4"))
    out = prep(tmp_path, shared_data / "corpus", split="validation", tokenizer=tok)
    index = json.loads((out / INDEX_FILE).read_text())
    # Numbers from ../shared/data/README.md: 30 records, 1,739,224 bytes, 388,503 sentencepiece tokens.
    assert index["num_documents"] == index["num_records"] == 30 and index["num_empty"] == 0
    assert index["num_bytes"] == 1_739_224
    assert index["num_tokens"] == 388_503 + 30  # plus one EOS per document
    assert index["dtype"] == "uint32"  # 73448 ids do not fit uint16
    assert index["tokenizer"] == {"name": tok.name, "vocab_size": 73448, "eos_id": 2, "bos_id": 1,
                                  "kind": "SentencePieceTokenizer", "path": str((shared_data / "tokenizers/minicpm4/tokenizer.model").resolve())}
    assert index["source"]["split"] == "validation" and index["source"]["files"][0].endswith("validation-00000-of-00001.parquet")
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "tokens-00000.bin"]
    shard = index["shards"][0]
    assert shard["sha256"] == hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
    # Token stream against sentencepiece itself, documents in file order.
    sp = spm.SentencePieceProcessor(model_file=str(shared_data / "tokenizers/minicpm4/tokenizer.model"))
    ref = [i for r in validation_records for i in sp.encode(r["text"]) + [2]]
    shards = TokenShards(out, verify=True)
    assert (shards.num_tokens, shards.num_bytes, shards.eos_id) == (len(ref), 1_739_224, 2)
    assert shards.tokens(0, shards.num_tokens).tolist() == ref


def test_num_proc_does_not_change_the_output(shared_data, tmp_path):
    """Two spawn workers with the repaired tokenizer.json give the same bytes as one process with
    tokenizer.model (order kept, ids equal)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("sentencepiece")
    minicpm = shared_data / "tokenizers" / "minicpm4"
    one = prep(tmp_path, shared_data / "corpus", split="validation", tokenizer=load_tokenizer(str(minicpm)), out="one")
    two = prep(tmp_path, shared_data / "corpus", split="validation", tokenizer=load_tokenizer(str(minicpm / "tokenizer.json")),
               out="two", num_proc=2)
    assert (one / "tokens-00000.bin").read_bytes() == (two / "tokens-00000.bin").read_bytes()


def test_folder_maps_splits_by_file_name(shared_data):
    splits = resolve_local_splits(str(shared_data / "corpus"))
    assert [Path(f).name for f in splits["train"]] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert [Path(f).name for f in splits["validation"]] == ["validation-00000-of-00001.parquet"]
    assert [Path(f).name for f in splits["sample"]] == ["sample.jsonl"]


def test_folder_layouts(tmp_path, write_jsonl):
    hub = tmp_path / "hub"  # the Hub's data/<split>-*.ext layout, plus a split-named folder
    write_jsonl(hub / "data" / "train-00000-of-00001.jsonl", [{"text": "a"}])
    write_jsonl(hub / "data" / "validation-00000-of-00001.jsonl", [{"text": "b"}])
    write_jsonl(hub / "test" / "part" / "anything.jsonl", [{"text": "c"}])
    (hub / "README.md").write_text("not data")
    write_jsonl(hub / ".cache" / "train-x.jsonl", [{"text": "hidden"}])
    splits = resolve_local_splits(str(hub))
    assert {k: [Path(f).name for f in v] for k, v in splits.items()} == {
        "train": ["train-00000-of-00001.jsonl"], "validation": ["validation-00000-of-00001.jsonl"], "test": ["anything.jsonl"]}
    single = resolve_local_splits(str(hub / "data" / "*.jsonl"))
    assert list(single) == ["train"] and len(single["train"]) == 2  # a glob is one split, as in HF


def test_source_kind_detection(tmp_path):
    assert not is_local_source("HuggingFaceFW/fineweb-edu") and not is_local_source("wikitext")
    for local in ("./data", "../x", "/abs/path", "~/corpus", "file.parquet", "shards/*.jsonl", str(tmp_path)):
        assert is_local_source(local), local


# --- jsonl with a template -----------------------------------------------------------------------


def test_jsonl_with_template(tmp_path, write_jsonl, jsonl_records):
    src = write_jsonl(tmp_path / "docs.jsonl", jsonl_records)
    out = prep(tmp_path, src, template="{title}\n\n{text}")
    texts = [f"{r['title']}\n\n{r['text'] or ''}" for r in jsonl_records]  # None renders as ""
    index = json.loads((out / INDEX_FILE).read_text())
    assert index["dtype"] == "uint16"
    assert (index["num_records"], index["num_documents"], index["num_empty"]) == (5, 5, 0)
    assert index["num_bytes"] == sum(len(t.encode()) for t in texts)
    assert index["source"]["text_template"] == "{title}\n\n{text}" and index["source"]["text_field"] == ""
    assert TokenShards(out).tokens(0, index["num_tokens"]).tolist() == stream_of(texts)


def test_jsonl_text_field_skips_empty_documents(tmp_path, write_jsonl, jsonl_records):
    src = write_jsonl(tmp_path / "docs.jsonl", jsonl_records)
    out = prep(tmp_path, src)
    texts = [r["text"] for r in jsonl_records if r["text"]]
    index = json.loads((out / INDEX_FILE).read_text())
    assert (index["num_records"], index["num_documents"], index["num_empty"]) == (5, 3, 2)
    assert TokenShards(out).tokens(0, index["num_tokens"]).tolist() == stream_of(texts)


def test_other_formats(tmp_path):
    """parquet (glob), txt (one record per line), gzip jsonl and a save_to_disk DatasetDict all read
    the same three documents."""
    import gzip

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = ["first doc", "second — doc", "third 🙂"]
    pq.write_table(pa.table({"text": docs[:2]}), tmp_path / "p-0.parquet")
    pq.write_table(pa.table({"text": docs[2:]}), tmp_path / "p-1.parquet")
    (tmp_path / "lines.txt").write_text("\n".join(docs) + "\n")
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs}),
                          "validation": datasets.Dataset.from_dict({"text": ["v"]})}).save_to_disk(str(tmp_path / "saved"))
    for i, source in enumerate([tmp_path / "p-*.parquet", tmp_path / "lines.txt", tmp_path / "docs.jsonl.gz", tmp_path / "saved"]):
        assert all_tokens(prep(tmp_path, source, out=f"out{i}")) == stream_of(docs), source
    with pytest.raises(ConfigError, match="use one of: train, validation"):
        prep(tmp_path, tmp_path / "saved", split="test", out="bad")


def test_many_shards_read_back_across_boundaries(tmp_path, write_jsonl):
    rng = random.Random(0)
    records = [{"text": "".join(rng.choice("abcdefgh ñ€") for _ in range(rng.randint(1, 90)))} for _ in range(700)]
    src = write_jsonl(tmp_path / "many.jsonl", records)
    out = prep(tmp_path, src, shard_max_bytes=2 * 997)  # 997 tokens per shard: boundaries fall mid-document
    ref = torch.tensor(stream_of([r["text"] for r in records]))
    shards = TokenShards(out, verify=True)
    index = shards.index
    assert len(index["shards"]) == -(-len(ref) // 997) > 10
    assert all(s["num_tokens"] == 997 for s in index["shards"][:-1])
    assert torch.equal(shards.tokens(0, len(ref)), ref)
    for _ in range(200):
        start = rng.randrange(len(ref))
        length = rng.randrange(min(3000, len(ref) - start) + 1)
        assert torch.equal(shards.tokens(start, length), ref[start:start + length])
    with pytest.raises(IndexError):
        shards.tokens(len(ref) - 1, 2)


# --- atomicity -----------------------------------------------------------------------------------


class CrashingTokenizer(ByteTokenizer):
    """A real byte tokenizer that fails on its second batch, i.e. after a shard was partly written."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def encode_batch(self, texts):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("simulated crash mid-write")
        return super().encode_batch(texts)


@pytest.fixture
def big_jsonl(tmp_path, write_jsonl) -> Path:
    return write_jsonl(tmp_path / "src" / "big.jsonl", [{"text": f"document {i} " * 20} for i in range(1200)])


def test_crash_mid_write_leaves_no_target(tmp_path, big_jsonl):
    parent = tmp_path / "prepared"
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare_split(source=str(big_jsonl), config_name="", split="train", text_field="text", text_template="",
                      tokenizer=CrashingTokenizer(), out_dir=parent / "train", progress=False)
    assert not parent.exists()  # neither the split nor the parent folder this call created


def test_crash_leaves_previous_split_untouched(tmp_path, big_jsonl):
    out = prep(tmp_path, big_jsonl, out="prepared/train")
    before = snapshot(out)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prep(tmp_path, big_jsonl, out="prepared/train", tokenizer=CrashingTokenizer())
    assert snapshot(out) == before
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == ["train"]  # no temp folders left


def test_killed_process_leaves_no_target(tmp_path, big_jsonl):
    """A real SIGKILL mid-write (no cleanup runs at all): the target never appears."""
    marker = tmp_path / "first-batch-done"
    target = tmp_path / "prepared" / "train"
    code = f"""
import time
from pathlib import Path
from engine.data.prepare import prepare_split
from engine.data.tokenizer import ByteTokenizer
class Slow(ByteTokenizer):
    n = 0
    def encode_batch(self, texts):
        self.n += 1
        if self.n == 2:
            Path({str(marker)!r}).touch()
            time.sleep(60)
        return super().encode_batch(texts)
prepare_split(source={str(big_jsonl)!r}, config_name="", split="train", text_field="text", text_template="",
              tokenizer=Slow(), out_dir=Path({str(target)!r}), progress=False)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "child never reached its second batch"
            time.sleep(0.05)
        partial = [p for p in (tmp_path / "prepared").iterdir()]
        assert partial and all(p.name.startswith(".train.tmp-") for p in partial)
        assert any(f.name.startswith("tokens-") for p in partial for f in p.iterdir())  # a shard was being written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not target.exists()
    # The next run builds it completely (the dead run's hidden temp folder is left to the user).
    prep(tmp_path, big_jsonl, out="prepared/train")
    assert (target / INDEX_FILE).is_file()


def test_rerun_replaces_previous_split(tmp_path, write_jsonl):
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": "first version"}])
    out = prep(tmp_path, src, out="p/train")
    write_jsonl(src, [{"text": "second, longer version"}])
    prep(tmp_path, src, out="p/train")
    assert TokenShards(out).tokens(0, TokenShards(out).num_tokens).tolist() == stream_of(["second, longer version"])
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["train"]


def test_refuses_to_replace_a_folder_that_is_not_a_split(tmp_path, write_jsonl):
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    precious = tmp_path / "home" / "train"
    precious.mkdir(parents=True)
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not an earlier prepared split") as err:
        prep(tmp_path, src, out="home/train")
    assert err.value.field == "--out" and (precious / "notes.txt").read_text() == "keep me"


# --- user errors: ConfigError, nothing written ---------------------------------------------------


def assert_nothing_written(tmp_path: Path, out: str = "out") -> None:
    assert not (tmp_path / out).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("num_proc", [0, -2])
def test_num_proc_below_one(tmp_path, num_proc):
    from engine.config import EngineConfig
    from engine.data.prepare import prepare_from_config

    with pytest.raises(ConfigError, match=f"--num-proc={num_proc} is out of range: use 1"):
        prepare_from_config(EngineConfig(preset="tiny"), tmp_path / "out", num_proc=num_proc, progress=False)
    assert_nothing_written(tmp_path)


def test_missing_text_field(tmp_path, write_jsonl, jsonl_records):
    src = write_jsonl(tmp_path / "docs.jsonl", jsonl_records)
    with pytest.raises(ConfigError) as err:
        prep(tmp_path, src, field="body")
    msg = str(err.value)
    assert err.value.field == "--hf-text-field" and "'title', 'text', 'n'" in msg and "--hf-text-template" in msg
    assert_nothing_written(tmp_path)
    with pytest.raises(ConfigError) as err:
        prep(tmp_path, src, template="{title}: {summary}")
    assert err.value.field == "--hf-text-template" and "['summary']" in str(err.value)
    assert_nothing_written(tmp_path)


def test_bad_templates(tmp_path, write_jsonl, jsonl_records):
    src = write_jsonl(tmp_path / "docs.jsonl", jsonl_records)
    for template, problem in (("{title", "not a valid format string"), ("{} and {}", "positional"),
                              ("no fields", "uses no record field")):
        with pytest.raises(ConfigError, match=problem) as err:
            prep(tmp_path, src, template=template)
        assert err.value.field == "--hf-text-template"
    assert_nothing_written(tmp_path)


def test_non_text_field(tmp_path, write_jsonl, jsonl_records):
    src = write_jsonl(tmp_path / "docs.jsonl", jsonl_records)
    with pytest.raises(ConfigError, match="holds int values") as err:
        prep(tmp_path, src, field="n")
    assert err.value.field == "--hf-text-field"
    assert_nothing_written(tmp_path)


def test_empty_dataset_and_empty_text(tmp_path, write_jsonl):
    empty = tmp_path / "src" / "empty.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty") as err:
        prep(tmp_path, empty)
    assert err.value.field == "--hf-dataset"
    assert_nothing_written(tmp_path)
    blank = write_jsonl(tmp_path / "src" / "blank.jsonl", [{"text": ""}, {"text": None}])
    with pytest.raises(ConfigError, match="renders empty text for all 2 records") as err:
        prep(tmp_path, blank)
    assert err.value.field == "--hf-text-field"
    assert_nothing_written(tmp_path)


def test_unknown_split_lists_available(tmp_path, write_jsonl):
    folder = tmp_path / "ds"
    write_jsonl(folder / "train-00000.jsonl", [{"text": "a"}])
    write_jsonl(folder / "validation-00000.jsonl", [{"text": "b"}])
    with pytest.raises(ConfigError) as err:
        prep(tmp_path, folder, split="test")
    assert err.value.field == "--hf-split" and "use one of: train, validation" in str(err.value)
    assert_nothing_written(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        prep(tmp_path, tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="matches no data files"):
        prep(tmp_path, tmp_path / "nope-*.jsonl")
    with pytest.raises(ConfigError, match="--hf-dataset-config"):
        prepare_split(source=str(folder), config_name="en", split="train", text_field="text", text_template="",
                      tokenizer=ByteTokenizer(), out_dir=tmp_path / "out", progress=False)
    assert_nothing_written(tmp_path)


# --- prepare_from_config -------------------------------------------------------------------------


def cfg_for(**kw) -> EngineConfig:
    return dataclasses.replace(EngineConfig(), **kw)


def test_vocab_too_large_writes_nothing(tmp_path, write_jsonl):
    src = write_jsonl(tmp_path / "ds" / "train.jsonl", [{"text": "a"}])
    with pytest.raises(ConfigError) as err:
        prepare_from_config(cfg_for(hf_dataset=str(src), vocab_size=200), out_dir=tmp_path / "out")
    assert err.value.field == "--vocab-size" and "pass --vocab-size 258" in str(err.value)
    assert_nothing_written(tmp_path)


def test_vocab_too_large_minicpm4(tmp_path, minicpm_dir):
    pytest.importorskip("sentencepiece")
    with pytest.raises(ConfigError, match="pass --vocab-size 73448") as err:
        prepare_from_config(cfg_for(tokenizer_path=str(minicpm_dir), vocab_size=258), out_dir=tmp_path / "out")
    assert err.value.field == "--vocab-size"
    assert_nothing_written(tmp_path)


def test_from_config_folder_with_splits(tmp_path, write_jsonl):
    folder = tmp_path / "ds"
    write_jsonl(folder / "train-00000-of-00002.jsonl", [{"text": "alpha"}, {"text": "beta"}])
    write_jsonl(folder / "train-00001-of-00002.jsonl", [{"text": "gamma"}])
    write_jsonl(folder / "validation-00000-of-00001.jsonl", [{"text": "delta"}])
    out = prepare_from_config(cfg_for(hf_dataset=str(folder)), out_dir=tmp_path / "out", progress=False)
    assert all_tokens(out / "train") == stream_of(["alpha", "beta", "gamma"])
    assert all_tokens(out / "validation") == stream_of(["delta"])


def test_from_config_validation_rules(tmp_path, write_jsonl):
    train = write_jsonl(tmp_path / "ds" / "train.jsonl", [{"text": "alpha"}])
    val = write_jsonl(tmp_path / "other" / "held-out.jsonl", [{"text": "omega"}])
    # A single file has one split (`train`); without --hf-val-dataset there is no validation.
    with pytest.raises(ConfigError) as err:
        prepare_from_config(cfg_for(hf_dataset=str(train)), out_dir=tmp_path / "out")
    assert err.value.field == "--hf-val-split" and "--eval-samples 0" in str(err.value) and "--hf-val-dataset" in str(err.value)
    assert_nothing_written(tmp_path)
    out = prepare_from_config(cfg_for(hf_dataset=str(train), eval_samples=0), out_dir=tmp_path / "out", progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["train"]
    # A separate validation file is the validation set whatever --hf-val-split says.
    out = prepare_from_config(cfg_for(hf_dataset=str(train), hf_val_dataset=str(val)), out_dir=tmp_path / "out2", progress=False)
    assert all_tokens(out / "validation") == stream_of(["omega"])
    with pytest.raises(ConfigError, match="evaluating on training data"):
        prepare_from_config(cfg_for(hf_dataset=str(train), hf_val_split="train"), out_dir=tmp_path / "out3")


def test_from_config_embedded_corpus(tmp_path):
    from engine.data.embedded import read_embedded

    out = prepare_from_config(cfg_for(), out_dir=tmp_path / "out", progress=False)
    for split in ("train", "validation"):
        texts = [r["text"] for r in read_embedded(split)]
        shards = TokenShards(out / split)
        assert shards.index["source"]["kind"] == "embedded"
        assert shards.tokens(0, shards.num_tokens).tolist() == stream_of(texts)


def test_cli_prepare_end_to_end(tmp_path, write_jsonl, run_python):
    src = write_jsonl(tmp_path / "ds" / "train.jsonl", [{"t": "hello"}])
    val = write_jsonl(tmp_path / "ds2" / "val.jsonl", [{"t": "world"}])
    ok = run_python(f"import sys; from engine.cli import main; sys.exit(main(['prepare', '--hf-dataset', {str(src)!r}, "
                    f"'--hf-val-dataset', {str(val)!r}, '--hf-text-field', 't', '--out', {str(tmp_path / 'out')!r}]))")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert (tmp_path / "out" / "train" / INDEX_FILE).is_file() and (tmp_path / "out" / "validation" / INDEX_FILE).is_file()
    bad = run_python(f"import sys; from engine.cli import main; sys.exit(main(['prepare', '--hf-dataset', {str(src)!r}, "
                     f"'--hf-val-dataset', {str(val)!r}, '--out', {str(tmp_path / 'bad')!r}]))")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: --hf-text-field='text' names field(s) ['text']")
    assert not (tmp_path / "bad").exists()


def test_prepare_help_lists_only_the_flags_prepare_reads() -> None:
    """`engine prepare --help` offers the EngineConfig fields prepare reads, not pretrain's ~90 training flags; the
    list cannot drift from the code: every `cfg.<field>` engine/data/prepare.py reads is one of them."""
    import ast
    import contextlib
    import io
    from dataclasses import fields

    from engine.cli import main
    from engine.config import EngineConfig, flag_name
    from engine.data.prepare import PREPARE_FIELDS

    tree = ast.parse((REPO / "engine" / "data" / "prepare.py").read_text(encoding="utf-8"))
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "cfg"}
    assert read and read <= set(PREPARE_FIELDS), read - set(PREPARE_FIELDS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["prepare", "--help"])
    usage = out.getvalue().split("\n\n")[0]  # the usage block: every option, and only options
    offered = set(re.findall(r"\[(--[a-z][a-z0-9-]+)|(?<=\s)(--out)\b", usage))
    offered = {a or b for a, b in offered} - {"--help"}
    assert offered == {flag_name(f) for f in PREPARE_FIELDS} | {"--config", "--out", "--num-proc"}, offered
    assert len({f.name for f in fields(EngineConfig)}) > 3 * len(PREPARE_FIELDS)  # the training flags are left out
