"""Tokenizers the engine trains with: raw bytes, HF `tokenizers` (tokenizer.json), `sentencepiece`.

Why and how: docs/engine/data.md, section `engine/data/tokenizer.py`.
"""

import abc
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Sequence

from engine.errors import ConfigError

__all__ = [
    "Tokenizer",
    "ByteTokenizer",
    "SentencePieceTokenizer",
    "HFTokenizer",
    "load_tokenizer",
    "SentencePieceModelInfo",
    "read_sentencepiece_model",
]

_TOKENIZER_FLAG = "--tokenizer-path"
_SP_SPACE = "\u2581"  # sentencepiece's visible space '▁'
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
# Document-end tokens of common pretraining tokenizers, preferred over tokenizer_config's
# eos_token, which for chat models is the end-of-turn token (MiniCPM4: <|im_end|>).
_DOC_END_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")
_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")


class Tokenizer(abc.ABC):
    """What training and `prepare` need from a tokenizer.

    name: stable identity, including a hash of the tokenizer's content; shards record it and
        refuse a different tokenizer. vocab_size: largest id + 1 (special tokens included).
    eos_id: the document separator appended by `prepare`. bos_id: None when there is none.
    """

    name: str
    vocab_size: int
    eos_id: int
    bos_id: int | None

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without BOS or EOS."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts (backends override this with their batched, threaded call)."""
        return [self.encode(text) for text in texts]

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (for logs and samples; training never decodes)."""

    @abc.abstractmethod
    def token_byte_lengths(self) -> list[int]:
        """UTF-8 bytes each id stands for in running text (index = id, length = vocab_size).

        0 for special and control tokens, 1 for byte-fallback pieces <0xNN>, and a sentencepiece
        '▁' counts as one space byte. Summed over a document's ids it gives the document's UTF-8
        length whenever the tokenizer is lossless, which is what bits-per-byte needs.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class ByteTokenizer(Tokenizer):
    """ids 0..255 are the UTF-8 bytes, 256 is BOS, 257 is EOS (vocab 258: the `tiny` preset)."""

    def __init__(self) -> None:
        self.name = "bytes-258"
        self.vocab_size = 258
        self.bos_id = 256
        self.eos_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_byte_lengths(self) -> list[int]:
        return [1] * 256 + [0, 0]


# --- sentencepiece model files, read without the sentencepiece package ------------------------------


class SentencePieceModelInfo:
    """The few facts of a sentencepiece ModelProto the engine needs (see read_sentencepiece_model)."""

    # SentencePiece.Type in sentencepiece_model.proto
    NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

    def __init__(self, pieces: list[tuple[str, int]], add_dummy_prefix: bool, remove_extra_whitespaces: bool,
                 normalization_rule_name: str, unk_id: int, bos_id: int, eos_id: int, pad_id: int):
        self.pieces = pieces
        self.add_dummy_prefix = add_dummy_prefix
        self.remove_extra_whitespaces = remove_extra_whitespaces
        self.normalization_rule_name = normalization_rule_name
        self.unk_id, self.bos_id, self.eos_id, self.pad_id = unk_id, bos_id, eos_id, pad_id


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """Decode one protobuf message level into (field number, wire type, value) triples."""
    out = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, wire, value))
    if pos != len(buf):
        raise ValueError("truncated protobuf message")
    return out


def _int32(value: int) -> int:
    """Protobuf encodes negative int32 as a 64-bit two's complement varint."""
    return value - (1 << 64) if value >= 1 << 63 else value


def read_sentencepiece_model(data: bytes) -> SentencePieceModelInfo:
    """Parse the parts of a sentencepiece ModelProto that decide how tokenizer.json must behave.

    A 40-line reader instead of sentencepiece_model_pb2 (which needs protobuf) so that repairing a
    tokenizer.json never needs the sentencepiece package. Field numbers are those of
    sentencepiece_model.proto: ModelProto{1 pieces, 2 trainer_spec, 3 normalizer_spec};
    SentencePiece{1 piece, 3 type}; NormalizerSpec{1 name, 3 add_dummy_prefix, 4
    remove_extra_whitespaces}; TrainerSpec{40 unk_id, 41 bos_id, 42 eos_id, 43 pad_id}.
    Proto2 defaults apply to absent fields (add_dummy_prefix and remove_extra_whitespaces true).
    """
    pieces: list[tuple[str, int]] = []
    trainer = {40: 0, 41: 1, 42: 2, 43: -1}
    normalizer: dict[int, Any] = {1: "", 3: 1, 4: 1}
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            piece, kind = "", SentencePieceModelInfo.NORMAL
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 3 and w == 0:
                    kind = v
            pieces.append((piece, kind))
        elif number == 2 and wire == 2:
            for n, w, v in _fields(value):
                if n in trainer and w == 0:
                    trainer[n] = _int32(v)
        elif number == 3 and wire == 2:
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    normalizer[1] = v.decode("utf-8")
                elif n in (3, 4) and w == 0:
                    normalizer[n] = v
    if not pieces:
        raise ValueError("no pieces: not a sentencepiece model")
    return SentencePieceModelInfo(pieces, bool(normalizer[3]), bool(normalizer[4]), normalizer[1],
                                  trainer[40], trainer[41], trainer[42], trainer[43])


def _sha256(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(_TOKENIZER_FLAG, str(path), f"pass an intact tokenizer file ({err})", "cannot be read as JSON") from err


def _sibling_added_tokens(folder: Path) -> dict[int, tuple[str, bool]]:
    """Added tokens declared beside a tokenizer.model: {id: (content, special)}.

    HF keeps them outside the sentencepiece model (MiniCPM4's <|im_end|> ... at 73440-73447), yet
    they are ids the model has embeddings for, so they count in vocab_size.
    """
    found: dict[int, tuple[str, bool]] = {}
    config = folder / "tokenizer_config.json"
    if config.is_file():
        for key, spec in (_read_json(config).get("added_tokens_decoder") or {}).items():
            found[int(key)] = (spec["content"], bool(spec.get("special", False)))
    added = folder / "added_tokens.json"
    if added.is_file():
        for content, token_id in _read_json(added).items():
            found.setdefault(int(token_id), (content, True))
    return found


def _import_error(path: Path, package: str, err: ImportError) -> ConfigError:
    return ConfigError(_TOKENIZER_FLAG, str(path), f"pip install {package} (or temper-train[data])", f"needs the {package} package ({err})")


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece tokenizer.model, plus the added tokens HF declares beside it.

    Encodes exactly as `SentencePieceProcessor.encode(text)`: no BOS/EOS; control tokens written in
    the text are split into pieces like any other text.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        self.path = str(path.resolve())
        self._model = path.read_bytes()
        self._added = _sibling_added_tokens(path.parent)
        self._setup()

    def _setup(self) -> None:
        try:
            import sentencepiece
        except ImportError as err:
            raise _import_error(Path(self.path), "sentencepiece", err) from err
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=self._model)
        except (RuntimeError, OSError) as err:
            raise ConfigError(_TOKENIZER_FLAG, self.path, f"pass a valid sentencepiece tokenizer.model ({err})", "does not load") from err
        pieces = self._sp.get_piece_size()
        self._num_pieces = pieces
        # Only ids beyond the model's pieces are extra: the others (<unk>, <s>, </s>, which
        # tokenizer_config.json lists too) are defined by the model itself.
        extra = sorted((i, content) for i, (content, _) in self._added.items() if i >= pieces)
        self.vocab_size = max([pieces] + [i + 1 for i, _ in extra])
        added_blob = json.dumps(extra, ensure_ascii=False).encode()
        self.name = f"sentencepiece-{_sha256(self._model, added_blob)[:16]}"
        if self._sp.eos_id() < 0:
            raise ConfigError(_TOKENIZER_FLAG, self.path, "use a tokenizer with an end-of-sequence piece", "has no EOS (eos_id = -1)")
        self.eos_id = self._sp.eos_id()
        self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "model": self._model, "added": self._added}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self._model, self._added = state["path"], state["model"], state["added"]
        self._setup()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([i for i in ids if i < self._num_pieces])

    def token_byte_lengths(self) -> list[int]:
        sp = self._sp
        out = [0] * self.vocab_size  # added tokens beyond the model are special: 0
        for i in range(self._num_pieces):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                continue
            if sp.is_byte(i):
                out[i] = 1
            else:
                out[i] = len(sp.id_to_piece(i).replace(_SP_SPACE, " ").encode("utf-8"))
        return out


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable stand-in character -> byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _components(node: Any) -> list[dict[str, Any]]:
    """A normalizer / pre-tokenizer / decoder and, for a Sequence, its members (flat)."""
    if not isinstance(node, dict):
        return []
    members = node.get("normalizers") or node.get("pretokenizers") or node.get("decoders")
    if node.get("type") == "Sequence" and isinstance(members, list):
        return [c for m in members for c in _components(m)]
    return [node]


def _is_prepend_space(node: dict[str, Any]) -> bool:
    return node.get("type") == "Prepend" and node.get("prepend") == _SP_SPACE


def _align_with_sentencepiece(spec: dict[str, Any], info: SentencePieceModelInfo) -> list[str]:
    """Make a tokenizer.json produce its sibling tokenizer.model's ids; returns what was changed.

    Why: HF's Llama converter writes `Prepend("▁")` into the normalizer (or a Metaspace
    pre-tokenizer with prepend_scheme "first") whatever the model says; a model trained with
    `add_dummy_prefix=false` (MiniCPM4) never saw that extra '▁', so every document's first token
    would differ (sp `Hello` 15934 vs `▁Hello` 21045). Removing the prepend makes all 2,558 records of
    ../shared/data/corpus identical (data README, fix 1). The decoder's `Strip(" ", 1, 0)` undoes
    that prepend on decode, so it goes too, or decode would eat a real leading space.
    Sentencepiece also matches its USER_DEFINED pieces (`...`, `<p>`, `\\n`, full-width digits)
    whole, where tokenizer.json only has BPE merges (`...` -> `.`,`.`,`.`); they become non-special
    added tokens with their sentencepiece ids (README fix 2; it fixes `a...b`-style texts).
    Only applied when every sentencepiece piece has the same id in tokenizer.json, i.e. the two
    files really are one vocabulary.
    """
    vocab = dict(spec.get("model", {}).get("vocab") or {})
    for token in spec.get("added_tokens") or []:
        vocab.setdefault(token["content"], token["id"])
    if not isinstance(spec.get("model", {}).get("vocab"), dict):
        return []
    if any(vocab.get(piece) != i for i, (piece, _) in enumerate(info.pieces)):
        return []
    changes: list[str] = []
    if not info.add_dummy_prefix:
        norm = spec.get("normalizer")
        if isinstance(norm, dict) and _is_prepend_space(norm):
            spec["normalizer"] = None
            changes.append("normalizer: dropped Prepend('▁')")
        elif isinstance(norm, dict) and norm.get("type") == "Sequence":
            kept = [n for n in norm["normalizers"] if not _is_prepend_space(n)]
            if len(kept) != len(norm["normalizers"]):
                norm["normalizers"] = kept
                changes.append("normalizer: dropped Prepend('▁')")
        for pre in _components(spec.get("pre_tokenizer")):
            if pre.get("type") == "Metaspace" and pre.get("prepend_scheme", "always") != "never":
                pre["prepend_scheme"] = "never"
                pre.pop("add_prefix_space", None)
                changes.append("pre_tokenizer: Metaspace prepend_scheme -> never")
        if changes:
            dec = spec.get("decoder")
            strip = {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            if isinstance(dec, dict) and dec.get("type") == "Sequence":
                dec["decoders"] = [d for d in dec["decoders"] if d != strip]
            elif dec == strip:
                spec["decoder"] = None
    added = {token["content"] for token in spec.get("added_tokens") or []}
    user_defined = [(i, piece) for i, (piece, kind) in enumerate(info.pieces)
                    if kind == SentencePieceModelInfo.USER_DEFINED and piece not in added]
    for i, piece in user_defined:
        spec.setdefault("added_tokens", []).append({
            "id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": False})
    if user_defined:
        changes.append(f"added {len(user_defined)} sentencepiece user-defined pieces as added tokens")
    return changes


class HFTokenizer(Tokenizer):
    """An HF `tokenizers` tokenizer.json.

    With a sibling tokenizer.model the JSON is first aligned to it (`_align_with_sentencepiece`);
    `alignment` lists what changed. Special tokens in the text are plain text
    (`encode_special_tokens`), as in sentencepiece.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        self.path = str(path.resolve())
        spec = _read_json(path)
        if not isinstance(spec, dict) or "model" not in spec:
            raise ConfigError(_TOKENIZER_FLAG, str(path), "pass a HF tokenizers tokenizer.json", "is not a tokenizer.json (no 'model')")
        self.alignment: list[str] = []
        self._sp_info: SentencePieceModelInfo | None = None
        sibling = path.with_name("tokenizer.model")
        if sibling.is_file():
            try:
                self._sp_info = read_sentencepiece_model(sibling.read_bytes())
            except (ValueError, IndexError, UnicodeDecodeError) as err:
                raise ConfigError(_TOKENIZER_FLAG, str(sibling), f"remove or repair it ({err})", "is not a readable sentencepiece model") from err
            self.alignment = _align_with_sentencepiece(spec, self._sp_info)
        self._json = json.dumps(spec, ensure_ascii=False)
        self._config = self._read_configs(path.parent)
        self._setup()

    @staticmethod
    def _read_configs(folder: Path) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            if (folder / name).is_file():
                data = _read_json(folder / name)
                for key in ("eos_token", "bos_token"):
                    value = data.get(key)
                    if isinstance(value, dict):
                        value = value.get("content")
                    if isinstance(value, str):
                        merged[key] = value
        return merged

    def _setup(self) -> None:
        try:
            from tokenizers import Tokenizer as _Backend
        except ImportError as err:
            raise _import_error(Path(self.path), "tokenizers", err) from err
        try:
            self._tok = _Backend.from_str(self._json)
        except Exception as err:  # tokenizers raises plain Exception for bad JSON: re-raised as ConfigError
            raise ConfigError(_TOKENIZER_FLAG, self.path, f"pass a tokenizer.json that `tokenizers` can load ({err})", "does not load") from err
        self._tok.encode_special_tokens = True
        self._vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(self._vocab.values()) + 1
        self.eos_id = self._special_id("eos")
        self.bos_id = self._special_id("bos", required=False)
        # The EOS choice decides the prepared stream as much as the JSON does: both are the identity.
        self.name = f"hf-tokenizers-{_sha256(self._json.encode(), f'{self.eos_id}/{self.bos_id}'.encode())[:16]}"

    def _special_id(self, which: str, required: bool = True) -> int | None:
        """EOS / BOS: the sibling sentencepiece model's, else a known document-end/start token,
        else tokenizer_config.json's (see the module doc for why in this order)."""
        info = self._sp_info
        if info is not None:
            index = info.eos_id if which == "eos" else info.bos_id
            if 0 <= index < len(info.pieces) and info.pieces[index][0] in self._vocab:
                return self._vocab[info.pieces[index][0]]
        for name in _DOC_END_NAMES if which == "eos" else _BOS_NAMES:
            if name in self._vocab:
                return self._vocab[name]
        configured = self._config.get(f"{which}_token")
        if configured in self._vocab:
            return self._vocab[configured]
        if required:
            raise ConfigError(_TOKENIZER_FLAG, self.path, f"use a tokenizer whose vocabulary has one of {', '.join(_DOC_END_NAMES)} "
                              "or whose tokenizer_config.json names an eos_token",
                              "has no end-of-document token to separate documents")
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "json": self._json, "config": self._config, "sp_info": self._sp_info,
                "alignment": self.alignment}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self._json, self._config = state["path"], state["json"], state["config"]
        self._sp_info, self.alignment = state["sp_info"], state["alignment"]
        self._setup()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_byte_lengths(self) -> list[int]:
        """Byte-level BPE (GPT-2 style): one byte per alphabet character. Otherwise sentencepiece
        style: <0xNN> is one byte, '▁' one space, WordPiece's '##' prefix none (WordPiece drops
        whitespace, so its sums undercount; no such tokenizer is used for pretraining here)."""
        spec = json.loads(self._json)
        byte_level = any(c.get("type") == "ByteLevel" for key in ("pre_tokenizer", "decoder")
                         for c in _components(spec.get(key)))
        prefix = spec["model"].get("continuing_subword_prefix") or ""
        alphabet = _bytes_to_unicode() if byte_level else {}
        out = [0] * self.vocab_size
        for token, i in self._vocab.items():
            if byte_level:
                out[i] = sum(1 if ch in alphabet else len(ch.encode("utf-8")) for ch in token)
            elif _BYTE_PIECE.match(token):
                out[i] = 1
            else:
                if prefix and token.startswith(prefix):
                    token = token[len(prefix):]
                out[i] = len(token.replace(_SP_SPACE, " ").encode("utf-8"))
        for i, token in self._tok.get_added_tokens_decoder().items():
            out[i] = 0 if token.special else len(token.content.encode("utf-8"))
        return out


def load_tokenizer(path: str) -> Tokenizer:
    """"" -> ByteTokenizer; a folder -> its tokenizer.model if present, else its tokenizer.json;
    a file -> by name (*.model: sentencepiece, *.json: HF tokenizers)."""
    if not path:
        return ByteTokenizer()
    p = Path(path).expanduser()
    if p.is_dir():
        if (p / "tokenizer.model").is_file():
            return SentencePieceTokenizer(p / "tokenizer.model")
        if (p / "tokenizer.json").is_file():
            return HFTokenizer(p / "tokenizer.json")
        raise ConfigError(_TOKENIZER_FLAG, path, "pass a folder holding tokenizer.model or tokenizer.json, or one of those files",
                          "has no tokenizer.model or tokenizer.json")
    if not p.is_file():
        raise ConfigError(_TOKENIZER_FLAG, path, "pass an existing tokenizer.json, tokenizer.model, or a folder with one "
                          "(empty: the built-in byte tokenizer)", "does not exist")
    if p.suffix == ".model":
        return SentencePieceTokenizer(p)
    if p.suffix == ".json":
        return HFTokenizer(p)
    raise ConfigError(_TOKENIZER_FLAG, path, "pass a *.json (HF tokenizers) or *.model (sentencepiece) file", "has an unknown tokenizer type")
