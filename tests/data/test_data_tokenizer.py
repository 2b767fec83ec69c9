"""Tokenizers against independent references: raw UTF-8 bytes, and sentencepiece itself."""

import json
import pickle
from pathlib import Path

import pytest

from engine.data.embedded import read_embedded
from engine.data.tokenizer import (
    ByteTokenizer, HFTokenizer, SentencePieceTokenizer, load_tokenizer, read_sentencepiece_model,
)
from engine.errors import ConfigError

TRICKY = [
    "Hello world",
    "  two leading spaces, and trailing  ",
    "a...b -- c --- d ``` e",  # sentencepiece user-defined pieces: ..., ---, ```
    "<p>markup</p><br/>",
    "<|im_start|>user\nhi<|im_end|></s><s>",  # special tokens written as text stay text
    "tab\there\r\nCRLF",
    "naïve café — “quoted” … ０１２ 中文，。 🙂",
    "\n\nstarts with newlines",
]


# --- bytes --------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trips_and_matches_utf8():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (258, 256, 257)
    for text in TRICKY:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))  # reference: Python's own UTF-8 encoder
        assert tok.decode(ids) == text
    assert tok.encode_batch(TRICKY) == [list(t.encode()) for t in TRICKY]
    assert tok.decode([72, 105, 257, 256]) == "Hi"  # specials carry no text


def test_byte_lengths_sum_to_utf8_bytes_exactly_for_bytes():
    """Exact: one id per byte by construction, on the whole embedded corpus."""
    tok = ByteTokenizer()
    lengths = tok.token_byte_lengths()
    assert len(lengths) == tok.vocab_size and lengths[256:] == [0, 0]
    for record in read_embedded("validation"):
        assert sum(lengths[i] for i in tok.encode(record["text"])) == len(record["text"].encode("utf-8"))


# --- MiniCPM4: sentencepiece is the reference ---------------------------------------------------


@pytest.fixture(scope="module")
def sp_reference(minicpm_dir: Path):
    spm = pytest.importorskip("sentencepiece")
    return spm.SentencePieceProcessor(model_file=str(minicpm_dir / "tokenizer.model"))


@pytest.fixture(scope="module")
def hf_json(minicpm_dir: Path) -> HFTokenizer:
    pytest.importorskip("tokenizers")
    return load_tokenizer(str(minicpm_dir / "tokenizer.json"))


def test_folder_prefers_tokenizer_model(minicpm_dir: Path):
    pytest.importorskip("sentencepiece")
    assert isinstance(load_tokenizer(str(minicpm_dir)), SentencePieceTokenizer)


@pytest.mark.parametrize("which", ["folder", "tokenizer.model"])
def test_minicpm4_sentencepiece_ids_equal_reference(which, minicpm_dir, sp_reference, validation_texts):
    tok = load_tokenizer(str(minicpm_dir if which == "folder" else minicpm_dir / "tokenizer.model"))
    assert (tok.vocab_size, tok.eos_id, tok.bos_id) == (73448, 2, 1)
    assert tok.encode_batch(validation_texts) == [sp_reference.encode(t) for t in validation_texts]
    assert [tok.encode(t) for t in TRICKY] == [sp_reference.encode(t) for t in TRICKY]


def test_minicpm4_tokenizer_json_equals_sentencepiece_after_fix(hf_json, sp_reference, validation_texts):
    assert (hf_json.vocab_size, hf_json.eos_id, hf_json.bos_id) == (73448, 2, 1)
    assert any("Prepend" in change for change in hf_json.alignment)
    assert hf_json.encode_batch(validation_texts) == [sp_reference.encode(t) for t in validation_texts]
    # README fix 2 (user-defined pieces) and special tokens kept as text: every tricky case agrees.
    for text in TRICKY:
        assert hf_json.encode(text) == sp_reference.encode(text), text


def test_tokenizer_json_as_shipped_differs_so_the_comparison_can_fail(minicpm_dir, sp_reference, validation_texts):
    """The unrepaired file (tokenizers used directly) disagrees on the first token of every record,
    as the data README reports: the equality above is a real check, not a tautology."""
    tokenizers = pytest.importorskip("tokenizers")
    raw = tokenizers.Tokenizer.from_file(str(minicpm_dir / "tokenizer.json"))
    for text in validation_texts[:5]:
        ids = raw.encode(text, add_special_tokens=False).ids
        ref = sp_reference.encode(text)
        assert ids[0] != ref[0] and ids[1:4] == ref[1:4]


def test_special_tokens_in_text_never_become_control_ids(minicpm_dir, hf_json):
    pytest.importorskip("sentencepiece")
    text = "end<|im_end|> doc</s> next<s>"
    for tok in (load_tokenizer(str(minicpm_dir)), hf_json):
        ids = tok.encode(text)
        assert not {0, 1, 2, 73440} & set(ids), type(tok).__name__


def test_sentencepiece_byte_lengths_sum_to_utf8_bytes(minicpm_dir, sp_reference, hf_json, validation_texts):
    """Exact, not approximate: MiniCPM4's model has the identity normalizer, add_dummy_prefix=false,
    remove_extra_whitespaces=false and byte fallback, so encoding is lossless (checked here by
    decode(encode(x)) == x) and each piece's bytes ('▁' -> one space, <0xNN> -> one byte) are exactly
    the bytes it covers. A model with a dummy prefix or whitespace folding would be off by those
    characters; that is why the first check is part of the test."""
    sp_tok = load_tokenizer(str(minicpm_dir))
    for tok in (sp_tok, hf_json):
        lengths = tok.token_byte_lengths()
        assert len(lengths) == 73448
        assert lengths[:3] == [0, 0, 0] and lengths[73440:] == [0] * 8
        for text in validation_texts + TRICKY:
            ids = sp_reference.encode(text)
            assert sp_reference.decode(ids) == text
            assert sum(lengths[i] for i in ids) == len(text.encode("utf-8"))


def test_byte_fallback_pieces_count_one_byte(minicpm_dir, sp_reference):
    tok = load_tokenizer(str(minicpm_dir))
    lengths = tok.token_byte_lengths()
    byte_ids = [i for i in range(sp_reference.get_piece_size()) if sp_reference.is_byte(i)]
    assert len(byte_ids) == 256 and all(lengths[i] == 1 for i in byte_ids)
    rare = "\U0001f9ec\U0001fae0"  # DNA, melting face: likely byte-fallback
    ids = tok.encode(rare)
    assert sum(lengths[i] for i in ids) == len(rare.encode())


def test_sentencepiece_model_reader_matches_protobuf(minicpm_dir):
    pb = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    data = (minicpm_dir / "tokenizer.model").read_bytes()
    ref = pb.ModelProto()
    ref.ParseFromString(data)
    info = read_sentencepiece_model(data)
    assert info.pieces == [(p.piece, p.type) for p in ref.pieces]
    assert info.add_dummy_prefix == ref.normalizer_spec.add_dummy_prefix is False
    assert info.remove_extra_whitespaces == ref.normalizer_spec.remove_extra_whitespaces
    assert info.normalization_rule_name == ref.normalizer_spec.name
    assert (info.unk_id, info.bos_id, info.eos_id, info.pad_id) == (
        ref.trainer_spec.unk_id, ref.trainer_spec.bos_id, ref.trainer_spec.eos_id, ref.trainer_spec.pad_id)
    assert info.pad_id == -1  # negative int32 varint decoded


def test_names_are_content_hashes(minicpm_dir, hf_json, tmp_path):
    pytest.importorskip("sentencepiece")
    sp1 = load_tokenizer(str(minicpm_dir / "tokenizer.model"))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "tokenizer.model").write_bytes((minicpm_dir / "tokenizer.model").read_bytes())
    (copy / "added_tokens.json").write_bytes((minicpm_dir / "added_tokens.json").read_bytes())
    assert load_tokenizer(str(copy)).name == sp1.name  # same content elsewhere: same identity
    assert sp1.name != hf_json.name != ByteTokenizer().name
    # Without the added tokens beside it the model alone has 73440 ids: a different tokenizer.
    (copy / "added_tokens.json").unlink()
    alone = load_tokenizer(str(copy))
    assert alone.vocab_size == 73440 and alone.name != sp1.name


def test_tokenizers_pickle_for_worker_processes(minicpm_dir, hf_json):
    pytest.importorskip("sentencepiece")
    for tok in (ByteTokenizer(), load_tokenizer(str(minicpm_dir)), hf_json):
        clone = pickle.loads(pickle.dumps(tok))
        assert clone.name == tok.name and clone.vocab_size == tok.vocab_size
        assert [clone.encode(t) for t in TRICKY] == [tok.encode(t) for t in TRICKY]


# --- a byte-level BPE tokenizer.json (GPT-2 family), trained here --------------------------------


@pytest.fixture(scope="module")
def byte_level_json(tmp_path_factory) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([r["text"] for r in read_embedded("train")[:10]], trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_byte_level_bpe_lengths_and_eos(byte_level_json):
    tok = load_tokenizer(str(byte_level_json))
    assert isinstance(tok, HFTokenizer) and tok.alignment == []
    spec = json.loads(byte_level_json.read_text())
    assert tok.eos_id == next(t["id"] for t in spec["added_tokens"] if t["content"] == "<|endoftext|>")
    assert tok.bos_id is None
    lengths = tok.token_byte_lengths()
    assert lengths[tok.eos_id] == 0
    for text in TRICKY + [r["text"] for r in read_embedded("validation")]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert sum(lengths[i] for i in ids) == len(text.encode("utf-8"))  # exact: byte-level BPE is lossless
    assert tok.encode("<|endoftext|>") != [tok.eos_id]  # special tokens in text stay text


def test_eos_from_tokenizer_config_when_no_known_name(byte_level_json, tmp_path):
    spec = json.loads(byte_level_json.read_text())
    rename = {"<|endoftext|>": "<END>", "<|pad|>": "<PAD>"}
    for token in spec["added_tokens"]:
        token["content"] = rename[token["content"]]
    spec["model"]["vocab"] = {rename.get(k, k): v for k, v in spec["model"]["vocab"].items()}
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="no end-of-document token") as err:
        load_tokenizer(str(folder))
    assert err.value.field == "--tokenizer-path"
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<END>"}))
    tok = load_tokenizer(str(folder))
    assert tok.eos_id == spec["added_tokens"][0]["id"]


# --- errors -------------------------------------------------------------------------------------


def test_load_tokenizer_errors_name_the_flag(tmp_path):
    assert isinstance(load_tokenizer(""), ByteTokenizer)
    (tmp_path / "empty").mkdir()
    (tmp_path / "vocab.txt").write_text("a\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "bad.model").write_bytes(b"\x00\x01garbage")
    cases = {str(tmp_path / "missing"): "does not exist", str(tmp_path / "empty"): "no tokenizer.model",
             str(tmp_path / "vocab.txt"): "unknown tokenizer type", str(tmp_path / "bad.json"): "cannot be read as JSON"}
    for path, problem in cases.items():
        with pytest.raises(ConfigError, match=problem) as err:
            load_tokenizer(path)
        assert err.value.field == "--tokenizer-path"
    pytest.importorskip("sentencepiece")
    with pytest.raises(ConfigError, match="does not load"):
        load_tokenizer(str(tmp_path / "bad.model"))
