"""Checkpoints and exports: DCP save and load (store), the background save (async_save), per-file checksums
(checksums), the HF Llama export (hf_export) and the int8 export (int8_export). docs/checkpoints.md says how.

The modules sit on different import layers (guards.toml), so this package re-exports nothing: import the module.
"""

__all__: list[str] = []
