"""ParallelState: who this process is in the TP x DP layout, and its process groups.

Megatron's layout: TP groups are consecutive ranks (so they share a host and its NVLink), DP groups
are strided. With world size W and TP size T: rank r has tp_rank = r % T, dp_rank = r // T.
A single process is the W = T = 1 case of the same object, so the training loop has one code path.

With more TP ranks than KV heads, each KV head lives on `kv_replicas` = T / kv_heads consecutive TP
ranks; `kv_group` joins the ranks holding the same head, whose K/V weight gradients are summed.
"""

import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.distributed.nodes import check_nodes
from engine.distributed.watchdog import exit_with_parent
from engine.env import LaunchEnv
from engine.errors import ConfigError

__all__ = ["ParallelState", "init_parallel", "shutdown_parallel"]


@dataclass(frozen=True)
class ParallelState:
    rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int
    device: torch.device
    tp_group: "dist.ProcessGroup | None" = None
    dp_group: "dist.ProcessGroup | None" = None
    kv_group: "dist.ProcessGroup | None" = None  # TP ranks sharing this rank's replicated KV head
    hosts: tuple[str, ...] = ()  # host name of each node, in node order (the run header's record)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @staticmethod
    def single(device: torch.device) -> "ParallelState":
        return ParallelState(rank=0, world_size=1, tp_rank=0, tp_size=1, dp_rank=0, dp_size=1, device=device)


def init_parallel(env: LaunchEnv, tp: int, device_type: str, timeout_s: float = 1800.0,
                  kv_replicas: int = 1) -> ParallelState:
    """Initialise torch.distributed (NCCL on GPU, gloo on CPU) and the TP / DP (/ KV-replica) groups.

    Every rank must call new_group for every group, in the same order, even for groups it is not
    in: that is torch.distributed's contract.
    """
    check_nodes(env, tp)
    if device_type == "cuda":
        gpus = torch.cuda.device_count()
        if env.local_rank >= gpus:
            raise ConfigError("--nproc-per-node", env.local_world_size,
                              f"start at most {gpus} processes per node (one per GPU)",
                              f"gives local rank {env.local_rank} but this host has {gpus} GPU(s)")
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
    else:
        device = torch.device("cpu")
    if env.launcher == "torchrun":  # its workers outlive it otherwise (engine/distributed/watchdog.py)
        exit_with_parent()
    if env.world_size == 1:
        return ParallelState.single(device)
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device_type == "cuda" else {}
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=timeout_s), **kwargs)
    world = env.world_size
    dp = world // tp
    tp_group = dp_group = None
    for start in range(0, world, tp):
        ranks = list(range(start, start + tp))
        group = dist.new_group(ranks)
        if env.rank in ranks:
            tp_group = group
    for offset in range(tp):
        ranks = list(range(offset, world, tp))
        group = dist.new_group(ranks)
        if env.rank in ranks:
            dp_group = group
    kv_group = None
    if kv_replicas > 1:
        for start in range(0, world, kv_replicas):  # consecutive blocks inside each TP group
            ranks = list(range(start, start + kv_replicas))
            group = dist.new_group(ranks)
            if env.rank in ranks:
                kv_group = group
    names: list[str | None] = [None] * world
    dist.all_gather_object(names, socket.gethostname())
    hosts = tuple(str(names[node * env.local_world_size]) for node in range(env.num_nodes))
    return ParallelState(rank=env.rank, world_size=world, tp_rank=env.rank % tp, tp_size=tp,
                         dp_rank=env.rank // tp, dp_size=dp, device=device, tp_group=tp_group, dp_group=dp_group,
                         kv_group=kv_group, hosts=hosts)


def shutdown_parallel() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
