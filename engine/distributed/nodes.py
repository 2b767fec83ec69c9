"""How the launcher's processes sit on hosts, checked before any process group is made.

The layout (engine/distributed/state.py) puts TP groups on consecutive ranks so that TP traffic stays
on one host. That holds only when every node runs the same number of processes and ranks are
numbered node by node (rank = node_rank x per_node + local_rank), and when a TP group fits in a
node. torchrun and srun --distribution=block number ranks that way; a launcher started with another
--nproc-per-node on one host, or a node count that does not divide the world, breaks it. Each rank
sees the mismatch in its own environment, so every rank refuses the same way, no collective needed.
"""

from engine.env import LaunchEnv
from engine.errors import ConfigError

__all__ = ["check_nodes"]


def check_nodes(env: LaunchEnv, tp: int) -> None:
    """Raise ConfigError (field, value, fix) unless `env` is a layout of equal nodes that holds whole TP groups."""
    nodes, world, per_node = env.num_nodes, env.world_size, env.local_world_size
    if nodes < 1:
        raise ConfigError("--nnodes", nodes, "start at least one node", "is out of range")
    if world % nodes:
        raise ConfigError("--nnodes", nodes, f"start the same --nproc-per-node on every node ({nodes} nodes x N "
                          f"processes), or pass --nnodes that divides {world}",
                          f"does not divide the number of processes ({world})")
    if per_node * nodes != world:
        raise ConfigError("--nproc-per-node", per_node, f"pass the same --nproc-per-node ({world // nodes}) to every "
                          f"node's launcher", f"on node {env.node_rank} differs from the other nodes' ({world} processes "
                          f"over {nodes} nodes)")
    if not 0 <= env.local_rank < per_node or env.rank != env.node_rank * per_node + env.local_rank:
        raise ConfigError("rank", env.rank, "number ranks node by node: launch with torchrun, or srun "
                          "--distribution=block", f"is local rank {env.local_rank} of node {env.node_rank} "
                          f"({per_node} per node), not rank {env.node_rank * per_node + env.local_rank}")
    if nodes > 1 and per_node % tp:
        raise ConfigError("--tp", tp, f"use a TP size that divides the processes per node ({per_node}), so that each "
                          "TP group stays on one host", f"splits a TP group across nodes ({nodes} x {per_node})")
