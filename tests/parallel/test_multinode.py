"""Several nodes: torchrun --nnodes 2 with c10d rendezvous, two launchers on this host standing in for two
hosts (CPU, gloo), against one launcher with the same four processes; and the node layouts the engine refuses.

Reference for the two-node run: `torchrun --nproc-per-node 4` (one node) with the same flags, seed and global
batch. Tolerance 1e-5 relative on every printed loss and grad norm and on every weight of the final checkpoint
(as tests/parallel/test_launch_resume.py: the same ranks run the same ops, so any difference is float32
reduction order; observed equal bit for bit). A rank numbered on the wrong node, a data slice or TP block
taken by local rank instead of rank, or a checkpoint shard lost by one node's writer is off by far more.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.distributed.nodes import check_nodes
from engine.env import LaunchEnv, launch_env
from engine.errors import ConfigError
from engine.checkpoint.hf_export import load_full_weights
from tests.engine.helpers import REPO, deterministic_fields, loss_lines
from tests.parallel.launch import TINY_DP, torchrun

# TP 2 x DP 2, global batch 4 = DP 2 x mbs 1 x GAS 2, 4 steps, the final checkpoint at step 4
RUN = ["pretrain", *TINY_DP, "--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "2", "--num-steps", "4",
       "--save-every", "4"]


def _env(**kw: int | str) -> LaunchEnv:
    base = {"rank": 0, "local_rank": 0, "world_size": 4, "local_world_size": 2, "launcher": "torchrun",
            "slurm_job_id": "", "num_nodes": 2, "node_rank": 0}
    return LaunchEnv(**{**base, **kw})  # type: ignore[arg-type]


# --- the launcher's variables, read and checked (cheap: no process is started) ----------------------------------


@pytest.mark.parametrize("values, unset, want", [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
      "GROUP_WORLD_SIZE": "2"}, ("SLURM_PROCID", "SLURM_NTASKS"), (3, 1, 4, 2, 2, 1)),  # torchrun, node 1 of 2
    ({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1"},
     ("RANK", "WORLD_SIZE"), (2, 0, 4, 2, 2, 1)),  # srun without torchrun, node 1 of 2
])
def test_launcher_variables_give_rank_local_rank_and_node(monkeypatch, values, unset, want):
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    env = launch_env()
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.num_nodes, env.node_rank) == want
    check_nodes(env, tp=2)


@pytest.mark.parametrize("env, tp, field, words", [
    (_env(world_size=3, local_world_size=2), 1, "--nnodes", "does not divide the number of processes (3)"),
    (_env(world_size=4, local_world_size=3), 1, "--nproc-per-node", "pass the same --nproc-per-node (2)"),
    (_env(rank=2, local_rank=0, node_rank=0), 1, "rank", "is local rank 0 of node 0"),  # ranks not node by node
    (_env(rank=1, local_rank=2), 1, "rank", "srun --distribution=block"),  # local rank past the node's count
    (_env(world_size=8, local_world_size=4), 8, "--tp", "splits a TP group across nodes (2 x 4)"),
    (_env(world_size=6, local_world_size=3), 2, "--tp", "divides the processes per node (3)"),
])
def test_layouts_that_do_not_tile_the_nodes_are_refused(env, tp, field, words):
    with pytest.raises(ConfigError) as err:
        check_nodes(env, tp)
    assert err.value.field == field and words in str(err.value)


def test_one_node_takes_any_tp_that_divides_the_world():
    check_nodes(_env(world_size=8, local_world_size=8, num_nodes=1), tp=8)
    check_nodes(_env(rank=5, local_rank=1, node_rank=1, world_size=8, local_world_size=4), tp=4)


def test_node_count_that_does_not_divide_the_world_exits_2_and_writes_nothing(tmp_path):
    """The engine as torchrun starts rank 0 of `--nnodes 2` with 2 + 1 processes: one line, exit 2, no run dir."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
           "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    proc = subprocess.run([sys.executable, "-m", "engine", "pretrain", "--preset", "tiny", "--device", "cpu",
                           "--micro-batch-size", "1", "--global-batch-size", "3", "--run-dir", str(run_dir)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--nnodes=2 does not divide the number of processes (3)" in lines[0], proc.stderr
    assert not run_dir.exists()


# --- two launchers on this host: a real c10d rendezvous (slow: 8 processes on 2 cores) --------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(per_node: tuple[int, int], *args: str, node1_prefix: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess]:
    """One torchrun per "node", both on this host, meeting by c10d rendezvous at 127.0.0.1:<free port>;
    `node1_prefix` wraps the second node's launcher (a mount namespace that hides a folder from it)."""
    port, run_id = _free_port(), f"temper-test-{os.getpid()}"
    launchers = [subprocess.Popen(
        [*(node1_prefix if node else ()), sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
         "--nproc-per-node", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
         run_id, "--max-restarts", "0", "-m", "engine", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
        for node, n in enumerate(per_node)]
    out = []
    for launcher in launchers:
        stdout, stderr = launcher.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(launcher.args, launcher.returncode, stdout, stderr))
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.slow
def test_two_nodes_match_one_node(tmp_path):
    one = torchrun(4, *RUN, "--run-dir", str(tmp_path / "one"))
    two = _two_nodes((2, 2), *RUN, "--run-dir", str(tmp_path / "two"))
    for proc in two:
        assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-4000:]}"
    head = next(p for p in two if loss_lines(p.stdout))  # the launcher of node 0 holds rank 0, which prints
    assert "layout launcher=torchrun world=4 tp=2 dp=2 nodes=2 per_node=2" in head.stdout
    assert "layout launcher=torchrun world=4 tp=2 dp=2 nodes=1 per_node=4" in one.stdout
    got = [deterministic_fields(x) for x in loss_lines(head.stdout)]
    want = [deterministic_fields(x) for x in loss_lines(one.stdout)]
    assert [g[0] for g in got] == [w[0] for w in want] == ["1", "2", "3", "4"]
    for g, w in zip(got, want):
        for field, a, b in zip(("loss", "grad norm"), g[1:3], w[1:3]):
            assert abs(float(a) - float(b)) <= 1e-5 * abs(float(b)), f"step {g[0]}: {field} {a} vs {b}"
    _, w_two = load_full_weights(tmp_path / "two" / "checkpoints" / "step_00000004")
    _, w_one = load_full_weights(tmp_path / "one" / "checkpoints" / "step_00000004")
    assert sorted(w_two) == sorted(w_one)
    for name, ref in w_one.items():
        assert w_two[name].shape == ref.shape and _rel(w_two[name], ref) < 1e-5, name


@pytest.mark.slow
def test_two_nodes_with_unequal_process_counts_are_refused(tmp_path):
    """Launchers with --nproc-per-node 2 and 1 under --nnodes 2: world 3, rank 0's one line, nothing written. Rank 0
    exits 2; both torchruns then exit 1 (torch's own: the other launcher loses the rendezvous store with node 0)."""
    run_dir = tmp_path / "run"
    procs = _two_nodes((2, 1), "pretrain", "--preset", "tiny", "--device", "cpu", "--micro-batch-size", "1",
                       "--global-batch-size", "3", "--run-dir", str(run_dir))
    assert all(p.returncode != 0 for p in procs)
    errors = [line for p in procs for line in p.stderr.splitlines() if "--nnodes=" in line]
    assert errors == ["error: --nnodes=2 does not divide the number of processes (3): start the same --nproc-per-node on "
                      "every node (2 nodes x N processes), or pass --nnodes that divides 3"], [p.stderr for p in procs]
    assert not run_dir.exists()



@pytest.mark.slow
def test_a_run_dir_not_shared_by_the_nodes_is_refused_at_the_first_save(tmp_path):
    """Node 1 runs in a mount namespace (bubblewrap) whose run dir is its own empty tmpfs, as a host's local disk:
    its shards land where rank 0 cannot see them. The first save stops every rank with one line naming --save-dir
    and the fix; nothing is published (no `latest`, no step folder), only the unfinished `.tmp`."""
    from harness.jobs.sandbox import bwrap_binary

    bwrap = bwrap_binary()
    if bwrap is None:
        pytest.skip("no bubblewrap here: cannot give the second node its own filesystem")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hide = (bwrap, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", str(run_dir), "--")
    procs = _two_nodes((1, 1), "pretrain", *TINY_DP, "--micro-batch-size", "1", "--global-batch-size", "2",
                       "--num-steps", "2", "--save-every", "2", "--run-dir", str(run_dir), node1_prefix=hide)
    assert all(p.returncode != 0 for p in procs)
    for proc in procs:  # every rank refuses alike (no rank left waiting in a collective)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: --save-dir=")]
        assert len(errors) == 1 and "is not shared by the nodes: rank 0 does not see 1 shard file(s)" in errors[0] \
            and "(e.g. __1_0.distcp): put --run-dir / --save-dir on a filesystem every node sees" in errors[0], proc.stderr
    saved = run_dir / "checkpoints"
    assert sorted(p.name for p in saved.iterdir()) == ["step_00000002.tmp"]
