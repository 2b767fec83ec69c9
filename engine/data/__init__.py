"""Data pipeline: tokenizers, `prepare` (datasets -> memory-mapped token shards), packing and loading.

Flow: `prepare` renders each record (a text field or a format template), tokenizes it, appends the
tokenizer's EOS and writes the token stream as raw uint16/uint32 shards plus `index.json`
(engine/data/format.py). Training reads those shards through `TokenShards` (mmap), cuts the stream
into seq+1 samples (`PackedSamples`) and deals shuffled global batches to data-parallel ranks
(`BatchLoader`), whose position is part of every checkpoint. `build_data` picks the source:
--data-mix (several prepared folders sampled by weight: `MixedSamples` / `MixLoader` in mix.py), else
--data-path, else --hf-dataset (prepared on the fly into a cache), else the embedded corpus.

Importing this package (or any module in it) loads only the standard library and torch; datasets,
tokenizers and sentencepiece are imported inside the functions that need them.
"""

__all__: list[str] = []
