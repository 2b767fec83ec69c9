"""Compile our CuTeDSL RMSNorm kernels (engine/ops/rmsnorm/cute_rmsnorm.py) without a GPU.

    export PYTHONPATH=/tmp/cute-site:/tmp/cute-site/nvidia_cutlass_dsl/dsl_packages:$PWD CUTE_DSL_ARCH=sm_90a
    python bench/rmsnorm_compile_check.py

CuTeDSL traces and compiles against fake tensors, so every DSL and type error surfaces here on a
CPU-only machine. Compiles, for n in (1024, 4096, 1000) (1000: the predicated, not-a-multiple-of-the-tile
path) and bf16 activations: the forward with and without residual, the backward with residual (with
and without ds_out) and without. Also an fp32 weight and an fp16 residual for the two mixed-dtype
paths. Kernels cannot run here. The persistent cache is switched off: nothing is written to disk.
Exit 0 when everything compiled, 1 (with the failing combination and traceback) otherwise.
"""

import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]


def main() -> int:
    import cutlass
    import quack.cache

    from engine.ops.rmsnorm import cute_rmsnorm as k

    quack.cache.CACHE_ENABLED = False  # compile only, write nothing
    bf16, fp16, fp32 = cutlass.BFloat16, cutlass.Float16, cutlass.Float32
    jobs = []
    for n in (1024, 4096, 1000):
        jobs += [
            (f"fwd plain n={n}", lambda n=n: k.compile_fwd(bf16, None, bf16, n)),
            (f"fwd residual n={n}", lambda n=n: k.compile_fwd(bf16, bf16, bf16, n)),
            (f"bwd plain n={n}", lambda n=n: k.compile_bwd(bf16, bf16, bf16, n, False, False)),
            (f"bwd residual+ds_out n={n}", lambda n=n: k.compile_bwd(bf16, bf16, bf16, n, True, True)),
            (f"bwd residual, no ds_out n={n}", lambda n=n: k.compile_bwd(bf16, bf16, bf16, n, True, False)),
        ]
    jobs += [
        ("fwd residual fp16 res, fp32 weight n=4096", lambda: k.compile_fwd(bf16, fp16, fp32, 4096)),
        ("bwd residual fp16 res, fp32 weight n=4096", lambda: k.compile_bwd(fp16, bf16, fp32, 4096, True, True)),
        ("fwd plain n=8192", lambda: k.compile_fwd(bf16, None, bf16, 8192)),
        ("bwd residual n=8192", lambda: k.compile_bwd(bf16, bf16, bf16, 8192, True, True)),
    ]
    failed = 0
    for name, job in jobs:
        t0 = time.perf_counter()
        try:
            job()
        except Exception:  # reported with its traceback and counted: the script exits non-zero
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
            continue
        print(f"ok   {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"{len(jobs) - failed}/{len(jobs)} compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
