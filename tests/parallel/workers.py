"""Training scenarios run by every rank of a gloo process group (torch.multiprocessing spawns them).

A module of its own (not a test file). Each scenario builds the real Trainer on a real ParallelState
(engine.distributed.init_parallel) and steps it; rank 0 returns the numbers to the test through a file.
`single_run` is the same code on one process, the reference every parallel layout is compared with.

The ranks are forked from the test process (`launch`), which has torch and the engine imported already: a spawned
rank paid ~3 s of interpreter start and imports before its first step, more than the tiny scenarios take. The test
process never initialises torch.distributed itself, so each rank starts one process group of its own.
"""

import contextlib
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import build_config, resolve
from engine.distributed import ParallelState, init_parallel
from engine.env import LaunchEnv
from engine.evaluate import evaluate
from engine.model import batch_documents
from engine.train import Trainer, resolve_device

__all__ = ["RECAST", "FSDP_PROBE", "SAVE_TO", "BASE", "make_config", "single_run", "launch", "spawn", "run_trainer", "fixed_tokens", "TickClock", "spawn_runs"]

# tiny preset, fp32 on CPU, short sequences: a 20-step trajectory takes about a second per process.
BASE: dict[str, Any] = dict(preset="tiny", device="cpu", compute_dtype="fp32", seq_length=64, micro_batch_size=4,
                            eval_samples=12, num_steps=20, warmup_steps=2, save_final=False)


# A scenario override (not a config field): run it on tensorwise FP8's recast path (tests/engine/fp8_recast.py).
RECAST = "_fp8_recast"
# A scenario override (not a config field): instead of training, one step of an --fsdp run watched (fsdp_probe).
FSDP_PROBE = "_fsdp_probe"
# A scenario override (not a config field): the run dir (kept) where every rank saves the scenario's last step.
SAVE_TO = "_save_to"
# The collectives FSDP2 issues (torch 2.13 names them *_single; earlier releases *_tensor)
_FSDP_COLLECTIVES = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
                     "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter"}


def make_config(overrides: dict[str, Any], world: int, run_dir: str):
    return resolve(build_config({**BASE, **overrides, "run_dir": run_dir}), world)


def fixed_tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(7))


def _val_loss(trainer: Trainer) -> float:
    """nan when the run evaluates nothing (--eval-samples 0, e.g. data without a validation split)."""
    if trainer.cfg.eval_samples == 0:
        return math.nan
    return evaluate(trainer.model, trainer.data.validation, trainer.cfg, trainer.par, trainer.token_bytes)[0]


def run_trainer(trainer: Trainer, steps: int) -> dict[str, Any]:
    """Logits of a fixed batch and the validation loss (BASE: 12 samples) before and after `steps` steps,
    and each step's (loss, grad norm). With --document-mask the fixed batch holds a few EOS, and its logits
    are read within documents."""
    tokens = fixed_tokens(trainer.cfg.vocab_size)
    documents = None
    if trainer.cfg.document_mask:
        eos = trainer.data.train.shards.eos_id
        tokens[0, [9, 10, 40]] = eos
        tokens[1, 30] = eos
        documents = batch_documents(trainer.cfg, tokens, eos, trainer.par.device)
    out: dict[str, Any] = {"logits0": trainer.model.logits(tokens, documents), "val0": _val_loss(trainer), "steps": [],
                           "launched_by_backward": [], "gathers_in_flight_after_step": [],
                           "buckets": len(trainer.buffers.buckets) if trainer.buffers is not None else 0}
    for _ in range(steps):
        loss, grad_norm, _ = trainer.train_step()
        trainer.step += 1
        out["steps"].append((loss, grad_norm))
        if trainer.fsdp is None:  # ZeRO-1's own overlap counters
            out["launched_by_backward"].append(trainer.grad_sync.launched_by_backward)
            out["gathers_in_flight_after_step"].append(trainer.param_gather.in_flight)
    out["logits"] = trainer.model.logits(tokens, documents)
    out["val"] = _val_loss(trainer)
    if trainer.param_gather is not None:
        trainer.param_gather.wait_all()
    if trainer.par.world_size == 1:
        out["weights"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        out["config"] = trainer.cfg
    return out


def fsdp_probe(trainer: Trainer) -> dict[str, Any]:
    """One step of an --fsdp run, micro-batch by micro-batch, watched: the all-gathers and reduce-scatters FSDP2
    issues in each forward and backward, how many all-gathers were issued when each decoder layer's forward starts
    (its own, the ones before it, and those prefetched), which layers hold sharded weights (DTensors) after each
    forward and backward and that none does while it computes, whether every sharded gradient exists, and the dtypes
    the gradients were reduce-scattered in. Also what each all-gather sends (its input's dtype and bytes), what the
    FP8 linears' weights are while a layer computes (their types), and with --fsdp-fp8-all-gather each precomputed
    scale beside amax_scale's of the whole weight (gathered here by all_gather_object)."""
    from torch.distributed.tensor import DTensor

    layers = list(trainer.model.layers)
    counts = {"all_gather": 0, "reduce_scatter": 0}
    reduced: set[str] = set()  # the dtypes gradients were reduce-scattered in
    sent: list[tuple[str, int]] = []  # each all-gather's input: (dtype, bytes)
    originals = {name: getattr(dist, name) for name in _FSDP_COLLECTIVES if hasattr(dist, name)}

    def counted(name: str):
        def call(*args, **kwargs):
            counts[_FSDP_COLLECTIVES[name]] += 1
            if _FSDP_COLLECTIVES[name] == "reduce_scatter":
                reduced.add(str(next(t.dtype for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))))
            else:
                t = kwargs["input_tensor"] if "input_tensor" in kwargs else args[1]
                sent.append((str(t.dtype), t.numel() * t.element_size()))
            return originals[name](*args, **kwargs)
        return call

    def sharded() -> list[bool]:
        return [isinstance(next(layer.parameters()), DTensor) for layer in layers]

    at_forward: list[tuple[int, bool]] = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, i=i: at_forward.append((counts["all_gather"], sharded()[i])))
             for i, layer in enumerate(layers)]
    linear_types: set[str] = set()  # the FP8 linears' weights as a layer's attention and MLP compute
    hooks += [module.register_forward_pre_hook(lambda m, a: linear_types.update(
        type(getattr(m, name)).__name__ for name in m.fp8_linear_weights))
        for module in trainer.model.modules() if hasattr(module, "fp8_linear_weights")]
    out: dict[str, Any] = {"forward": [], "backward": [], "at_forward": [], "after_forward": [], "after_backward": [],
                            "grads": [], "fp8_scales": _fp8_scales(trainer)}
    trainer.fsdp.zero_grads()
    micro = trainer.loader.next_step()
    try:
        for name in originals:
            setattr(dist, name, counted(name))
        for i, (inputs, labels) in enumerate(micro):
            trainer.fsdp.start_micro_batch(last=i == len(micro) - 1)
            before = dict(counts)
            at_forward.clear()
            loss = trainer.model(inputs, labels)
            out["forward"].append({k: counts[k] - before[k] for k in counts})
            out["at_forward"].append([(n - before["all_gather"], own) for n, own in at_forward])
            out["after_forward"].append(sharded())
            before = dict(counts)
            loss.backward()
            out["backward"].append({k: counts[k] - before[k] for k in counts})
            out["after_backward"].append(sharded())
            out["grads"].append(all(p.grad is not None for _, p in trainer.fsdp.named))
        out["reduce_dtypes"] = sorted(reduced)
        out["sent"], out["linear_types"] = sent, sorted(linear_types)
        out["shard_bytes"] = _shard_bytes(trainer)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
        for hook in hooks:
            hook.remove()
    return out


def _fp8_scales(trainer: Trainer) -> list[tuple[float, float]]:
    """--fsdp-fp8-all-gather: (precomputed scale, amax_scale of the whole weight in the gathered dtype) per FP8
    weight; the whole weight is put together from every DP rank's plain shard."""
    from engine.distributed.fp8 import E4M3, amax_scale
    from engine.sharding.fp8_all_gather import plain_shard

    out = []
    for p in trainer.fsdp.fp8_weights:
        shard = p.to_local()
        pieces: list[Any] = [None] * trainer.par.dp_size
        dist.all_gather_object(pieces, plain_shard(shard).clone(), group=trainer.par.dp_group)
        whole = torch.cat(pieces).to(shard.dtype_gathered)
        out.append((shard.scale.value.item(), amax_scale(whole, E4M3, None, False).item()))
    return out


def _shard_bytes(trainer: Trainer) -> dict[str, int]:
    """Bytes of this rank's padded shards of the decoder layers' parameters, FP8 linears' and the others', in the
    dtype FSDP2 would gather them (the compute dtype here: fp32)."""
    out = {"fp8_linears": 0, "others": 0}
    for layer in trainer.model.layers:
        for module in layer.modules():
            fp8 = getattr(module, "fp8_linear_weights", ())
            for name, p in module.named_parameters(recurse=False):
                rows = math.ceil(p.shape[0] / trainer.par.dp_size)
                out["fp8_linears" if name in fp8 else "others"] += rows * (p.numel() // p.shape[0]) * p.element_size()
    return out


def single_run(overrides: dict[str, Any], steps: int, save_to: str = "") -> dict[str, Any]:
    """One process; with `save_to`, a checkpoint of the last step is written under that run dir."""
    with tempfile.TemporaryDirectory() as tmp, _path(overrides):
        cfg = make_config(_config_fields(overrides), 1, save_to or tmp)
        trainer = Trainer(cfg, ParallelState.single(torch.device("cpu")), torch.float32)
        out = run_trainer(trainer, steps)
        if save_to:
            out["checkpoint"] = str(trainer.save())
        trainer.metrics.close()
        return out


def _rank_main(rank: int, world: int, init_file: str, out_file: str, scenarios: list[tuple[str, dict, int]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    env = LaunchEnv(rank=rank, local_rank=rank, world_size=world, local_world_size=world, launcher="spawn",
                    slurm_job_id="")
    results = {}
    try:
        for name, overrides, steps in scenarios:
            with tempfile.TemporaryDirectory() as tmp, _path(overrides):
                cfg = make_config(_config_fields(overrides), world, overrides.get(SAVE_TO) or tmp)
                replicas = cfg.tp // cfg.num_kv_heads if cfg.tp > cfg.num_kv_heads else 1
                par = init_parallel(env, cfg.tp, "cpu", kv_replicas=replicas)
                # the compute dtype as pretrain resolves it (BASE: fp32; a scenario may ask bf16)
                trainer = Trainer(cfg, par, resolve_device(cfg)[1], launcher="spawn")
                results[name] = fsdp_probe(trainer) if overrides.get(FSDP_PROBE) else run_trainer(trainer, steps)
                results[name]["layout"] = (par.tp_size, par.dp_size)
                results[name]["placement"] = _placement(par, world)
                if overrides.get(SAVE_TO):
                    results[name]["checkpoint"] = str(trainer.save())
                trainer.metrics.close()
                dist.barrier()
        if rank == 0:
            torch.save(results, out_file)
    finally:
        dist.destroy_process_group()


def _config_fields(overrides: dict) -> dict:
    return {k: v for k, v in overrides.items() if k not in (RECAST, FSDP_PROBE, SAVE_TO)}


def _path(overrides: dict):
    """The FP8 recast reference (tests/engine/fp8_recast.py) for a scenario whose overrides hold RECAST."""
    if overrides.get(RECAST):
        from tests.engine.fp8_recast import recasting
        return recasting()
    return contextlib.nullcontext()


def _placement(par: ParallelState, world: int) -> list[dict[str, Any]]:
    """Every rank's coordinates and group members (all-gathered, so rank 0 can report them all)."""
    def members(group):
        return dist.get_process_group_ranks(group) if group is not None else None

    mine = {"rank": par.rank, "tp_rank": par.tp_rank, "dp_rank": par.dp_rank, "tp": members(par.tp_group),
            "dp": members(par.dp_group), "kv": members(par.kv_group), "backend": dist.get_backend(par.tp_group)}
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    return everyone


def launch(fn, args: tuple, world: int) -> None:  # noqa: ANN001 -- fn(rank, *args), a module-level function
    """`fn(rank, *args)` on `world` processes forked from this one; raises if any rank fails."""
    assert not dist.is_initialized(), "a forked rank would inherit this process's process group"
    mp.start_processes(fn, args=args, nprocs=world, start_method="fork")


def spawn(world: int, scenarios: list[tuple[str, dict, int]], tmp: Path) -> dict[str, Any]:
    """Run `scenarios` (name, config overrides, steps) on `world` gloo processes; rank 0's results."""
    out_file = tmp / "results.pt"
    launch(_rank_main, (world, str(tmp / "init"), str(out_file), scenarios), world)
    return torch.load(out_file)


class TickClock:
    """A fake monotonic clock for --max-wall-s: every read advances it by `tick` seconds (the Trainer reads it once
    when its loop starts and once after each step, so after step k of a run the clock says k x tick)."""

    def __init__(self, tick: float):
        self.tick = tick
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def _run_main(rank: int, world: int, init_file: str, out_file: str, overrides: dict, run_dir: str,
              ticks: list[float]) -> None:
    """Trainer.run() on every rank, rank r reading TickClock(ticks[r]); rank 0 saves every rank's final step."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    env = LaunchEnv(rank=rank, local_rank=rank, world_size=world, local_world_size=world, launcher="spawn",
                    slurm_job_id="")
    try:
        cfg = make_config(overrides, world, run_dir)
        par = init_parallel(env, cfg.tp, "cpu")
        trainer = Trainer(cfg, par, torch.float32, launcher="spawn", clock=TickClock(ticks[rank]))
        code = trainer.run()
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, {"rank": rank, "code": code, "step": trainer.step, "elapsed_s": trainer.elapsed_s})
        if rank == 0:
            torch.save(everyone, out_file)
    finally:
        dist.destroy_process_group()


def spawn_runs(world: int, overrides: dict, run_dir: Path, ticks: list[float], tmp: Path) -> list[dict[str, Any]]:
    """Trainer.run() of `overrides` on `world` gloo processes with per-rank fake clocks; each rank's outcome."""
    out_file = tmp / "ranks.pt"
    launch(_run_main, (world, str(tmp / "init"), str(out_file), overrides, str(run_dir), ticks), world)
    return torch.load(out_file)
