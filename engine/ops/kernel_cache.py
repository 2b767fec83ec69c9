"""On-disk caches for compiled CuTeDSL kernels (quack, flash-attn-4 and our own).

Why and how: docs/engine/ops.md, section `engine/ops/kernel_cache.py`.
"""

from pathlib import Path

from engine.env import kernel_cache_dir

__all__ = ["DEFAULT_KERNEL_CACHE", "kernel_cache_root", "configure_quack_cache", "configure_fa4_cache"]

DEFAULT_KERNEL_CACHE = "~/.cache/temper/kernels"

# flash-attn-4 keeps one JIT cache object per compiled entry point, created at import with the
# settings of that moment; these are the entry points and the cache names FA4 itself uses.
_FA4_CACHES = (
    ("_flash_attn_fwd", "fwd"),
    ("_bwd_preprocess", "bwd_pre"),
    ("_bwd_postprocess_convert", "bwd_post"),
    ("_flash_attn_bwd", "bwd"),
    ("_compute_tile_cumsum", "tile_cumsum"),
    ("_compute_blocks_to_batch", "blocks_to_batch"),
)

_configured: set[str] = set()


def kernel_cache_root() -> Path:
    """The kernel cache folder (created on first use by the libraries)."""
    raw = kernel_cache_dir()
    return Path(raw or DEFAULT_KERNEL_CACHE).expanduser()


def configure_quack_cache() -> Path:
    """Point quack's persistent jit_cache at <root>/quack; returns that folder.

    engine/ops is added to quack's source fingerprint, so editing one of our own CuTeDSL kernels
    (which compile through quack's jit_cache) invalidates their cached objects.
    """
    import quack.cache

    folder = kernel_cache_root() / "quack"
    if "quack" not in _configured:
        folder.mkdir(parents=True, exist_ok=True)
        quack.cache.CACHE_ENABLED = True
        quack.cache.CACHE_DIR = str(folder)
        ops_dir = Path(__file__).resolve().parent
        if ops_dir not in quack.cache.EXTRA_SOURCE_DIRS:
            quack.cache.EXTRA_SOURCE_DIRS.append(ops_dir)
        _configured.add("quack")
    return folder


def configure_fa4_cache() -> Path:
    """Enable flash-attn-4's persistent JIT cache under <root>/flash_attn; returns that folder."""
    import flash_attn.cute.cache_utils as fa_cache
    import flash_attn.cute.interface as fa_interface

    folder = kernel_cache_root() / "flash_attn"
    if "fa4" not in _configured:
        folder.mkdir(parents=True, exist_ok=True)
        fa_cache.CUTE_DSL_CACHE_ENABLED = True
        fa_cache.CUTE_DSL_CACHE_DIR = str(folder)
        for entry, name in _FA4_CACHES:
            # guard: allow isolation -- entry is a name of the literal table _FA4_CACHES
            fn = getattr(fa_interface, entry, None)
            if fn is not None:
                fn.compile_cache = fa_cache.get_jit_cache(name)
        _configured.add("fa4")
    return folder
