"""Run one peer in this process (bench/mfu.py launches it under torchrun, one process per GPU).

    torchrun --standalone --nproc-per-node 1 -m bench.peers.run --peer torch-compile --variant amp \
        --steps 8 --warmup 3 --out peer.json -- --preset minicpm4-8b --num-layers 4 --micro-batch-size 2 ...
    torchrun --standalone --nproc-per-node 4 -m bench.peers.run --peer torchtitan --layout tp=2,dp=2,ac=selective \
        --out peer.json -- --preset minicpm4-8b --micro-batch-size 2 --seq-length 4096 --global-batch-size 16

Everything after `--` are engine flags: the peer is configured from the engine's own resolved config, at its
--layout (bench/peers/layout.py: resolved against those flags on the launched processes, as bench/mfu.py does).
Rank 0 writes the result JSON (bench/peers/common.summarize); a peer that cannot import or run writes
{"error": ...} and exits 1, so the caller reports why and goes on. --profile-json profiles --profile-steps
more steps after the timed ones with bench/profile_step.py's summary (families, top kernels, GEMMs by shape,
idle gaps): where the peer's step goes, in the same table as the engine's profile.
"""

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from bench.peers.common import engine_config, summarize, time_steps
from bench.peers.layout import ONE_GPU, PEERS, PeerLayout, layout_flags, resolve_layout, row_name
from engine.atomic_files import write_text_atomic
from engine.runinfo import device_name

__all__ = ["main"]


def _versions(peer: str) -> dict[str, str]:
    from importlib import metadata

    out = {"torch": torch.__version__}
    for dist_name in {"torchtitan": ["torchtitan"], "megatron-core": ["megatron-core"], "torchao-fp8": ["torchao"]}.get(peer, []):
        try:
            out[dist_name] = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            out[dist_name] = "absent"
    return out


def _build(peer: str, variant: str, cfg, device: torch.device, layout: PeerLayout, attn_backend: str) -> tuple:
    """(step, notes for the versions column)."""
    if peer == "torch-compile":
        from bench.peers.compiled import build_step
        return build_step(cfg, variant or "amp", device, compile_model=layout.compile)[1], {}
    if peer == "torchao-fp8":
        from bench.peers.compiled import build_step
        return build_step(cfg, "bf16", device, compile_model=layout.compile, fp8=variant or "tensorwise")[1], {}
    if peer == "torchtitan":
        from bench.peers.titan import build_step
        _, step, notes = build_step(cfg, variant, device, layout, attn_backend=attn_backend)
        return step, notes
    if peer == "megatron-core":
        from bench.peers.megatron import build_step
        return build_step(cfg, variant, device, layout)
    raise ValueError(f"--peer {peer!r}: use one of {', '.join(PEERS)}")


def _profile(step, args: argparse.Namespace, result: dict, cfg, device: torch.device, rank: int) -> None:
    import statistics

    from bench.profile_step import markdown, profile_steps

    summary, times, trace = profile_steps(step, args.profile_steps, device)
    if rank != 0:
        return
    title = (f"{device_name(device)}, {result['name']} ({' '.join(f'{k}={v}' for k, v in result['versions'].items())}), mbs "
             f"{cfg.micro_batch_size} x seq {cfg.seq_length}, GAS {cfg.grad_accum_steps}")
    print(markdown(title, summary, 1e3 * statistics.median(times)))
    print(f"raw trace (not for git): {trace}")
    write_text_atomic(Path(args.profile_json), json.dumps({"title": title, "step_s": times, **summary}, indent=1))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", required=True, choices=PEERS)
    p.add_argument("--variant", default="")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--layout", default="", help="the peer's layout, k=v,... (bench/peers/layout.py; empty: its defaults)")
    p.add_argument("--attn-backend", default="", choices=["", "flex", "sdpa"],
                   help="torchtitan's attention (default: flex on CUDA, its own default; sdpa on CPU, where flex has "
                        "no backward: probes only, refused on CUDA)")
    p.add_argument("--out", required=True)
    p.add_argument("--profile-json", default="", help="also profile steps after the timed ones; summary JSON here")
    p.add_argument("--profile-steps", type=int, default=1)
    args = p.parse_args(argv[:split])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    flags = argv[split + 1:]
    name = args.peer + (f" {args.variant}" if args.variant else "")
    result: dict = {"name": name, "kind": "peer", "peer": args.peer, "variant": args.variant, "nproc": world}
    try:
        _, layout = resolve_layout(f"{args.peer}:{args.layout}", engine_config(flags, world), world)
        name = row_name(args.peer, args.variant, layout)
        result.update(name=name, layout=layout.record(args.peer))
        args.attn_backend = args.attn_backend or ("flex" if args.device == "cuda" else "sdpa")
        if args.device == "cuda" and args.attn_backend != "flex":
            raise ValueError("--attn-backend sdpa is for CPU probes; the GPU run keeps torchtitan's flex attention")
        cfg = engine_config([*flags, *layout_flags(layout)], world)
        if args.device == "cuda":
            torch.cuda.set_device(local)
        device = torch.device(args.device, local) if args.device == "cuda" else torch.device("cpu")
        if world > 1 or args.peer not in ONE_GPU:
            dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        step, notes = _build(args.peer, args.variant, cfg, device, layout, args.attn_backend)
        times, losses = time_steps(step, steps=args.steps, warmup=args.warmup, device=device)
        result = summarize(name, cfg, times, losses, device, world, fp8=args.peer == "torchao-fp8", peer=args.peer,
                           variant=args.variant,
                           layout=layout.record(args.peer), versions={**_versions(args.peer), **notes},
                           **({"attn_backend": args.attn_backend} if args.peer == "torchtitan" else {}))
        if args.profile_json:
            _profile(step, args, result, cfg, device, rank)
        code = 0
    except Exception as err:  # guard: allow broad-except -- reported to bench/mfu.py in the JSON, and exit 1
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()[-4000:]
        print(result["traceback"], file=sys.stderr)
        code = 1
    if rank == 0:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(result, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
