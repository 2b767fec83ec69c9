"""A peer's own parallel layout: `--peer NAME[:LAYOUT]` of bench/mfu.py, parsed, completed and checked.

A peer runs at the layout its users would pick on the hardware, not the engine variant's, so each `--peer`
carries one: comma-separated `key=value` pairs after a colon,

    torchtitan:dp=4,ac=selective                 FSDP 4, op-level SAC, per-block torch.compile
    torchtitan:tp=2,dp=2,ac=selective            2-D mesh: TP 2 (always sequence parallel) x FSDP 2
    megatron-core:tp=2,dp=2,sp=on,ac=selective   TP 2 + SP x DP 2 with the distributed optimizer

keys (a key left out takes the default in brackets):
    tp       tensor-parallel size [the engine's --tp]
    dp       data-parallel size [job GPUs / tp]; torchtitan shards it with FSDP2, megatron-core with its
             distributed optimizer; torch-compile and torchao-fp8 have none (dp=1)
    sp       sequence parallel, on|off [on when tp > 1 for the peers that have it]; torchtitan's TP always is
    ac       activation checkpointing: none | selective | full [none]; torchtitan: its op-level SAC policy /
             whole blocks; megatron-core: recompute_granularity selective (core attention) / full (uniform, 1)
    compile  torch.compile, on|off [on for torchtitan (per block), torch-compile and torchao-fp8; megatron-core has none]
    mbs      micro-batch size [the engine's --micro-batch-size]
    async_tp torchtitan's async TP (Inductor's micro-pipelined TP over symmetric memory, as its 70B / 405B recipes
             run it), on|off [off]; needs tp > 1 and compile=on

Every peer trains the job's global batch (the engine's, in sequences): GAS = global / (mbs x dp), and runs
on tp x dp processes, which must be the job's GPUs (--nproc, else the engine's --tp) so tokens/s compare.
A layout that cannot run is refused before any job starts: one line naming --peer, the value and the fix.
"""

from dataclasses import asdict, dataclass

__all__ = ["PeerLayout", "LayoutError", "PEERS", "PEER_VARIANTS", "ONE_GPU", "parse_peer", "resolve_layout", "layout_flags",
           "row_name"]

# variants each peer runs (one process each); "" is the peer's only one
PEER_VARIANTS = {"torch-compile": ["bf16", "amp"], "torchao-fp8": ["tensorwise", "rowwise"], "torchtitan": [""],
                 "megatron-core": [""]}
PEERS = tuple(PEER_VARIANTS)
ONE_GPU = ("torch-compile", "torchao-fp8")  # the plain-PyTorch loop (bench/peers/compiled.py): no layout but compile
KEYS = ("tp", "dp", "sp", "ac", "compile", "mbs", "async_tp")
AC_MODES = ("none", "selective", "full")
DP_MODE = {"torch-compile": "none", "torchao-fp8": "none", "torchtitan": "fsdp2", "megatron-core": "distributed-optimizer"}
DP_SHORT = {"torchtitan": "fsdp", "megatron-core": "distopt"}


class LayoutError(ValueError):
    """A --peer value that cannot run: str() is the one line bench/mfu.py prints before exiting 2."""

    def __init__(self, spec: str, problem: str, fix: str):
        super().__init__(f"--peer {spec!r}: {problem}; {fix}")


@dataclass(frozen=True)
class PeerLayout:
    """A peer's complete layout (resolve_layout fills every field); `gas` follows from the global batch."""

    tp: int
    dp: int
    sp: bool
    ac: str
    compile: bool
    mbs: int
    gas: int
    async_tp: bool = False

    @property
    def nproc(self) -> int:
        return self.tp * self.dp

    def record(self, peer: str) -> dict:
        """The layout as the result JSON stores it, with the peer's DP mechanism named."""
        return {**asdict(self), "nproc": self.nproc, "dp_mode": DP_MODE[peer] if self.dp > 1 else "none"}

    def short(self, peer: str) -> str:
        """e.g. `tp2-fsdp2-sp-sac-compile-mbs2` for the table's name column (no DP part at dp=1)."""
        dp = f"-{DP_SHORT.get(peer, 'dp')}{self.dp}" if self.dp > 1 else ""
        ac = {"none": "", "selective": "-sac", "full": "-fullac"}[self.ac]
        tp = f"tp{self.tp}{'-async' if self.async_tp else ''}"
        return f"{tp}{dp}{'-sp' if self.sp else ''}{ac}{'-compile' if self.compile else ''}-mbs{self.mbs}"


def _int(spec: str, key: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise LayoutError(spec, f"{key}={text!r} is not a positive integer", f"write e.g. {key}=2")
    return int(text)


def _bool(spec: str, key: str, text: str) -> bool:
    if text not in ("on", "off"):
        raise LayoutError(spec, f"{key}={text!r} is neither on nor off", f"write {key}=on or {key}=off")
    return text == "on"


def parse_peer(spec: str) -> tuple[str, dict]:
    """`NAME[:k=v,...]` -> (peer name, the keys given, typed); unknown names, keys and values are refused."""
    name, _, rest = spec.partition(":")
    if name not in PEERS:
        raise LayoutError(spec, f"{name!r} is not a peer", f"use one of {', '.join(PEERS)}")
    given: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in KEYS:
            raise LayoutError(spec, f"{item!r} is not a key=value of the layout",
                              f"use keys {', '.join(KEYS)} (e.g. {name}:tp=2,dp=2,ac=selective)")
        if key in given:
            raise LayoutError(spec, f"{key} is given twice", f"keep one {key}=")
        if key in ("tp", "dp", "mbs"):
            given[key] = _int(spec, key, value)
        elif key in ("sp", "compile", "async_tp"):
            given[key] = _bool(spec, key, value)
        elif value not in AC_MODES:
            raise LayoutError(spec, f"ac={value!r} is not a checkpointing mode", f"use ac={' | ac='.join(AC_MODES)}")
        else:
            given[key] = value
    return name, given


def resolve_layout(spec: str, cfg, nproc: int) -> tuple[str, PeerLayout]:
    """(peer, its complete layout) on `nproc` GPUs for the job's global batch; `cfg` is the engine's resolved config
    of the job's flags on `nproc` processes (shapes, --tp, --micro-batch-size and the global batch are read from it).
    Raises LayoutError (the first problem, with its fix) for a layout the peer or the shapes cannot run."""
    peer, given = parse_peer(spec)
    global_batch, seq_length = cfg.global_batch_size, cfg.seq_length
    tp = given.get("tp", cfg.tp if peer not in ONE_GPU else 1)
    if nproc % tp:
        raise LayoutError(spec, f"tp={tp} does not divide the job's {nproc} GPUs", f"use a divisor of {nproc}")
    dp = given.get("dp", nproc // tp)
    if tp * dp != nproc:
        raise LayoutError(spec, f"tp={tp} x dp={dp} = {tp * dp} processes, the job has {nproc} GPUs",
                          f"set dp={nproc // tp} (every row of one job runs on the same GPUs)")
    if peer in ONE_GPU and (tp, dp) != (1, 1):
        raise LayoutError(spec, f"{peer} is a one-GPU peer", "run it in a job of one GPU (tp=1, dp=1)")
    for name, width in (("--num-heads", cfg.num_heads), ("--ffn-hidden-size", cfg.ffn_hidden_size)):
        if width % tp:
            raise LayoutError(spec, f"tp={tp} does not divide {name} {width}", f"use a tp that divides {width}")
    if cfg.num_kv_heads % tp:  # the peers split whole KV heads over TP (the engine also replicates them)
        raise LayoutError(spec, f"tp={tp} does not divide --num-kv-heads {cfg.num_kv_heads}",
                          f"use a tp that divides {cfg.num_kv_heads}")
    sp_default = tp > 1 and peer not in ONE_GPU
    sp = given.get("sp", sp_default)
    if sp and tp == 1:
        raise LayoutError(spec, "sp=on needs tp > 1 (there is no TP group to split the sequence over)",
                          "leave out sp, or set tp=2")
    if peer == "torchtitan" and tp > 1 and not sp:
        raise LayoutError(spec, "torchtitan's TP plan always shards norms and residuals over the sequence",
                          "leave out sp (or sp=on) with tp > 1")
    if sp and seq_length % tp:
        raise LayoutError(spec, f"sp=on splits --seq-length {seq_length} over tp={tp}, which does not divide it",
                          "use a tp that divides the sequence length")
    ac = given.get("ac", "none")
    if peer in ONE_GPU and ac != "none":
        raise LayoutError(spec, f"{peer} has no activation checkpointing", "leave out ac")
    compile_default = peer != "megatron-core"
    compile_ = given.get("compile", compile_default)
    if peer == "megatron-core" and compile_:
        raise LayoutError(spec, "megatron-core does not torch.compile its model (its users run it eager)",
                          "leave out compile, or compile=off")
    async_tp = given.get("async_tp", False)
    if async_tp and (peer != "torchtitan" or tp == 1 or not compile_):
        raise LayoutError(spec, "async_tp=on is torchtitan's, with tp > 1 and compile=on (Inductor pipelines it)",
                          "use it with torchtitan:tp=2,compile=on, or leave it out")
    mbs = given.get("mbs", cfg.micro_batch_size)
    if global_batch % (mbs * dp):
        raise LayoutError(spec, f"the global batch of {global_batch} sequences does not split into mbs={mbs} x dp={dp}",
                          f"use an mbs that divides {global_batch // dp if global_batch % dp == 0 else global_batch}")
    return peer, PeerLayout(tp=tp, dp=dp, sp=sp, ac=ac, compile=compile_, mbs=mbs, gas=global_batch // (mbs * dp),
                            async_tp=async_tp)


def layout_flags(layout: PeerLayout) -> list[str]:
    """Engine flags that size the peer's config to its layout (appended to the job's flags; argparse keeps the
    last): TP (the padded vocabulary follows it), micro-batch and GAS, so the peer resolves the job's global
    batch on tp x dp processes. sp, ac and compile are read from the layout itself, not from engine flags."""
    return ["--tp", str(layout.tp), "--micro-batch-size", str(layout.mbs), "--grad-accum-steps", str(layout.gas),
            "--global-batch-size", str(layout.mbs * layout.gas * layout.dp)]


def row_name(peer: str, variant: str, layout: PeerLayout) -> str:
    """The table's name of a peer row: peer, variant, and the layout for the peers that have one (the one-GPU loops'
    names stay `torch-compile bf16`, `torchao-fp8 tensorwise`)."""
    name = peer + (f" {variant}" if variant else "")
    return name if peer in ONE_GPU else f"{name} {layout.short(peer)}"
