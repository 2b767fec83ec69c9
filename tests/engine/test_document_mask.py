"""--document-mask / --reset-position-ids (engine/model/documents.py) against independent references.

- The layout of a hand-written packed window: offsets, longest document, and the positions ops.rope
  derives from the offsets, written out here.
- A window packing documents A | B | C (A and B end with EOS, C is cut by the window's end), fp32 on
  CPU, tiny preset (muP scalings, GQA 4/2): each document's logits in the packed forward equal the
  engine run on that document alone, with --reset-position-ids and without it, and so do the
  gradients of every parameter (the packed loss with the labels that cross a document boundary
  ignored = the sum of the documents' own losses). Tolerance 1e-5 relative: the same products summed
  in another order (softmax rows of other lengths; with positions not reset, RoPE angles of other
  magnitudes, whose fp32 rounding grows with the angle); measured <= 4e-7.
- llama-tiny against HF transformers' LlamaForCausalLM given the block-diagonal causal mask (a 4D
  additive mask built here from the EOS positions) and the position ids: rel. 1e-5 (measured 0).
- Without the mask the packed window is not the documents alone (the test can fail).
- --activation-checkpointing recomputes each layer with the same layout: gradients bit for bit.
- Training end to end (CLI, tiny preset, a corpus of short documents): runs with the mask, evaluates,
  and its [LOSS] lines differ from the run without it.
"""

import json

import pytest
import torch

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.errors import ConfigError
from engine.model import batch_documents, build_model, document_layout
from engine.ops import resolve_ops
from engine.ops.rope.baseline import document_positions
from tests.engine.helpers import TINY_FAST, deterministic_fields, eval_lines, loss_lines, run_engine_batch

CPU = torch.device("cpu")
EOS = 257  # the byte tokenizer's


def model_for(preset: str = "tiny", **overrides):
    cfg = resolve(build_config({"preset": preset, "device": "cpu", "compute_dtype": "fp32", "seq_length": 48,
                                **overrides}))
    torch.manual_seed(0)
    return cfg, build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_layout_of_a_packed_window():
    tokens = torch.tensor([[5, EOS, 7, 8, EOS, 9],
                           [EOS, 1, 2, 3, 4, EOS]])  # an EOS at the very end starts nothing
    lay = document_layout(tokens, EOS, reset_positions=True)
    assert lay.cu_seqlens.dtype == torch.int32
    assert lay.cu_seqlens.tolist() == [0, 2, 5, 6, 7, 12]  # row 1 starts a document at 6 whatever came before
    assert lay.max_seqlen == 5
    assert lay.reset_positions and not document_layout(tokens, EOS, reset_positions=False).reset_positions
    # the positions ops.rope derives from the offsets (written out here by hand)
    assert document_positions(lay.cu_seqlens, 2, 6).tolist() == [[0, 1, 0, 1, 2, 0], [0, 0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match=r"\[b, s\]"):
        document_layout(tokens[0], EOS, reset_positions=False)
    cfg, _ = model_for()
    assert batch_documents(cfg, tokens, EOS, CPU) is None  # off: no layout, plain causal attention


def packed_window(vocab: int = 256) -> tuple[torch.Tensor, list[list[int]]]:
    g = torch.Generator().manual_seed(3)
    docs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (9, 17, 22)]
    docs[0].append(EOS)
    docs[1].append(EOS)
    return torch.tensor([sum(docs, [])]), docs  # 10 + 18 + 22 = 50 tokens, C cut by the window's end


def doc_labels(doc: list[int]) -> list[int]:
    """Next tokens within the document; the last position has none here (its label is another document's)."""
    return doc[1:] + [-100]


@pytest.mark.parametrize("reset", [True, False])
def test_packed_documents_equal_each_document_alone(reset):
    cfg, model = model_for(document_mask=True, reset_position_ids=reset, seq_length=50)
    window, docs = packed_window()
    labels = torch.tensor([sum((doc_labels(d) for d in docs), [])])
    lay = batch_documents(cfg, window, EOS, CPU)
    assert lay.cu_seqlens.tolist() == [0, 10, 28, 50]

    packed_logits = model.logits(window, lay)
    model.zero_grad()
    packed_loss = model(window, labels, lay)
    packed_loss.backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    alone_loss, start = 0.0, 0
    for doc in docs:
        tokens = torch.tensor([doc])
        one = batch_documents(cfg, tokens, EOS, CPU)
        assert one.cu_seqlens.tolist() == [0, len(doc)]  # one document: its EOS (if any) is its last token
        assert rel(packed_logits[:, start:start + len(doc)], model.logits(tokens, one)) < 1e-5
        loss = model(tokens, torch.tensor([doc_labels(doc)]), one)
        loss.backward()  # gradients add up over the documents
        alone_loss += loss.item()
        start += len(doc)
    assert packed_loss.item() == pytest.approx(alone_loss, rel=1e-5)
    for name, p in model.named_parameters():
        assert rel(packed_grads[name], p.grad) < 1e-5, name


def test_activation_checkpointing_recomputes_within_documents():
    """The layout travels into the recomputed layers: the same loss and gradients bit for bit (fp32 CPU)."""
    window, docs = packed_window()
    labels = torch.tensor([sum((doc_labels(d) for d in docs), [])])
    grads = []
    for recompute in ("none", "selective", "full"):
        cfg, model = model_for(document_mask=True, reset_position_ids=True, seq_length=50,
                               activation_checkpointing=recompute)
        model(window, labels, batch_documents(cfg, window, EOS, CPU)).backward()
        grads.append([p.grad for p in model.parameters()])
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))


def test_without_the_mask_documents_see_each_other():
    cfg, model = model_for(seq_length=50)
    window, docs = packed_window()
    later = torch.tensor([docs[1]])
    assert rel(model.logits(window)[:, 10:28], model.logits(later)) > 1e-2


@pytest.mark.parametrize("reset", [True, False])
def test_llama_tiny_matches_hf_with_an_explicit_block_mask(reset):
    transformers = pytest.importorskip("transformers")
    from tests.engine.test_reference import hf_llama

    cfg, model = model_for("llama-tiny", document_mask=True, reset_position_ids=reset, seq_length=40)
    hf = hf_llama(cfg, {n: p.detach() for n, p in model.named_parameters()})
    assert isinstance(hf, transformers.LlamaForCausalLM)
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    tokens[0, [5, 6, 20]] = EOS  # a one-token document between two EOS
    tokens[1, [0, 39]] = EOS
    # written out for the reference: document number = EOS tokens seen before the position
    doc = torch.cat([torch.zeros(2, 1, dtype=torch.long), (tokens[:, :-1] == EOS).long().cumsum(1)], dim=1)
    allowed = (doc[:, :, None] == doc[:, None, :]) & torch.ones(40, 40, dtype=torch.bool).tril()
    mask = torch.zeros(2, 1, 40, 40).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    first = torch.stack([torch.tensor([int((doc[r] == doc[r, t]).nonzero()[0]) for t in range(40)]) for r in range(2)])
    positions = torch.arange(40) - first if reset else torch.arange(40).expand(2, 40)
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=mask, position_ids=positions).logits
        unmasked = hf(input_ids=tokens).logits
    ours = model.logits(tokens, batch_documents(cfg, tokens, EOS, CPU))
    assert rel(ours, ref) < 1e-5
    assert rel(unmasked, ref) > 1e-2  # the mask matters on these tokens


def test_bad_combinations_fail_fast():
    with pytest.raises(ConfigError, match="--reset-position-ids"):
        model_for(reset_position_ids=True)
    cfg, model = model_for(document_mask=True)
    tokens = torch.randint(0, 256, (1, 48))
    with pytest.raises(ValueError, match="no DocumentLayout"):
        model.logits(tokens)  # never a silent plain-causal forward
    with pytest.raises(ValueError, match="does not match the config"):
        model.logits(tokens, document_layout(tokens, EOS, reset_positions=True))


def short_documents(folder, n: int, seed: int, prefix: str) -> None:
    g = torch.Generator().manual_seed(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept", "all", "day"]
    with (folder / f"{prefix}-00000.jsonl").open("w") as fh:
        for _ in range(n):  # 3 to 14 words: several documents in every window of 64 bytes
            length = int(torch.randint(3, 15, (), generator=g))
            text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (length,), generator=g))
            fh.write(json.dumps({"text": text}) + "\n")


def test_training_with_the_mask_end_to_end(tmp_path):
    data = tmp_path / "short"
    data.mkdir()
    short_documents(data, 400, 1, "train")
    short_documents(data, 60, 2, "validation")
    common = ["pretrain", *TINY_FAST, "--hf-dataset", str(data), "--data-cache-dir", str(tmp_path / "cache"),
              "--no-save-final"]
    # one process for both runs (tests/engine/engine_batch.py): whatever one left behind could only make them alike,
    # which fails the last check
    mask = ["--document-mask", "--reset-position-ids"]
    plain, masked = run_engine_batch([[*common, "--run-dir", str(tmp_path / "plain")],
                                      [*common, *mask, "--run-dir", str(tmp_path / "masked")]])
    assert plain.returncode == 0 and masked.returncode == 0, plain.stderr[-3000:] + masked.stderr[-3000:]
    got = [deterministic_fields(x) for x in loss_lines(masked.stdout)]
    want = [deterministic_fields(x) for x in loss_lines(plain.stdout)]
    assert len(got) == len(want) == 6
    assert eval_lines(masked.stdout)
    assert '"document_mask": true, ' in masked.stdout and '"reset_position_ids": true' in masked.stdout  # [CONFIG]
    losses = [float(x[1]) for x in got]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert [x[1] for x in got] != [x[1] for x in want]  # the mask changes what the model sees
