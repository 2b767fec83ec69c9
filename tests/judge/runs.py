"""Real tiny CPU training runs of the engine for the judge's evidence tests, plus the expected config
the judge is given (preset from engine/model_spec.toml overlaid with the run's flags, as the lead
builds it from a milestone's argv)."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from harness.judge.logparse import parse_engine_log, parse_eval_lines

__all__ = ["REPO", "BASE_ARGS", "DROP_MUP_LR", "flag_argv", "train", "expected_config", "validation_bytes", "Run", "pair_spec"]

REPO = Path(__file__).resolve().parents[2]
# Seconds per run on 2 CPU cores; warmup 2 so the lr changes every step (cosine over 6 steps).
BASE_ARGS = {"preset": "tiny", "device": "cpu", "seq-length": 64, "micro-batch-size": 4, "eval-samples": 8,
             "num-steps": 6, "warmup-steps": 2, "save-every": 1, "keep-last": 2}


class Run:
    def __init__(self, run_dir: Path, log: str, args: dict):
        self.run_dir, self.log, self.args = run_dir, log, args

    @property
    def save_dir(self) -> Path:
        return self.run_dir / "ck"

    def steps(self, log: str | None = None):
        return parse_engine_log(self.log if log is None else log)

    def evals(self, log: str | None = None):
        return parse_eval_lines(self.log if log is None else log)


# A planted regression for `train(prelude=...)`: an engine that silently trains every tensor at the printed lr
# (muP's hidden-matrix multipliers dropped), everything else honest.
DROP_MUP_LR = ("import engine.optim, engine.optim.mup\n"
               "def uniform(model, cfg):\n"
               "    return {name: 1.0 for name, _ in model.named_parameters()}\n"
               "engine.optim.mup.lr_multipliers = engine.optim.lr_multipliers = uniform\n")


def flag_argv(args: dict) -> list[str]:
    """{flag name: value} -> the engine's argv (booleans as --name / --no-name)."""
    out: list[str] = []
    for k, v in args.items():
        out += [f"--{k}" if v else f"--no-{k}"] if isinstance(v, bool) else [f"--{k}", str(v)]
    return out


def train(run_dir: Path, *, prelude: str = "", **overrides) -> Run:
    """`python -m engine pretrain` with BASE_ARGS and `overrides`; `prelude`: Python run in the engine's
    process before its CLI (a planted regression, e.g. DROP_MUP_LR)."""
    args = dict(BASE_ARGS) | {k.replace("_", "-"): v for k, v in overrides.items()}
    start = ["-c", f"{prelude}import sys\nfrom engine.cli import main\nsys.exit(main(sys.argv[1:]))"] if prelude \
        else ["-m", "engine"]
    argv = [sys.executable, *start, "pretrain", "--run-dir", str(run_dir), "--save-dir", str(run_dir / "ck"), *flag_argv(args)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return Run(run_dir, proc.stdout, args)


def expected_config(**flags) -> dict:
    """What the milestone promises: preset values overlaid with its flags (names with underscores)."""
    args = dict(BASE_ARGS) | {k.replace("_", "-"): v for k, v in flags.items()}
    with (REPO / "engine" / "model_spec.toml").open("rb") as fh:
        cfg = dict(tomllib.load(fh)[args["preset"]])
    for k, v in args.items():
        if k not in ("device", "save-every", "keep-last", "preset"):
            cfg[k.replace("-", "_")] = v
    # EngineConfig defaults the presets do not set, restated (the lead takes them from the base commit)
    cfg.setdefault("vocab_pad_multiple", 128)
    cfg.setdefault("adam_beta1", 0.9)
    cfg.setdefault("adam_beta2", 0.95)
    cfg.setdefault("adam_eps", 1e-8)
    cfg.setdefault("tp", 1)
    cfg.setdefault("lr_schedule", "cosine")
    cfg.setdefault("min_lr_ratio", 0.1)
    cfg.setdefault("decay_steps", 0)
    cfg.setdefault("weight_decay", 0.1)
    return cfg


def validation_bytes() -> bytes:
    return (REPO / "engine" / "data" / "corpus" / "validation.jsonl").read_bytes()


def edit_lines(log: str, marker: str, field: str, factor: float, fmt: str) -> str:
    """Multiply `field` in every `marker` line by `factor`, keeping the wire number format."""
    def fix(m: re.Match) -> str:
        return f"{m.group(1)}{format(float(m.group(2)) * factor, fmt)}"
    out = []
    for line in log.splitlines(keepends=True):
        if line.startswith(marker):
            line = re.sub(rf"( {field}=)(\S+)", fix, line)
        out.append(line)
    return "".join(out)


def rewrite_meta(save_dir: Path, **fields) -> None:
    """What a cheating run would write: its meta.json claims `fields`, and its manifest.json (engine/checkpoint/checksums.py)
    matches the claim (it is rewritten, or left out: the judge accepts a folder without one)."""
    for meta_file in save_dir.glob("step_*/meta.json"):
        meta = json.loads(meta_file.read_text())
        meta["config"].update(fields)
        meta_file.write_text(json.dumps(meta))
        (meta_file.parent / "manifest.json").unlink(missing_ok=True)


def pair_spec(tmp_path: Path, rules: str, verify: str = "", first_task: str = "train") -> Path:
    """milestones/pair.toml under tmp_path: job gates "a" (`first_task`) and "b" (train, `verify`: a line such as
    'verify = false'), then a metrics gate with `rules` (TOML inline tables, comma-separated)."""
    job = ('[[gates]]\nkind = "job"\nname = "{0}"\ntask = "{1}"\ntimeout_s = 60\n{2}argv = [{3}]\n')
    train_argv = '"pretrain", "--preset", "tiny", "--run-dir", "{job_dir}"'
    prepare_argv = '"prepare", "--preset", "tiny", "--out", "{job_dir}/shards"'
    text = ('id = "pair"\ntitle = "t"\ngoal = "g"\neditable = ["engine/**"]\n[[gates]]\nkind = "protected"\n'
            + job.format("a", first_task, "", train_argv if first_task == "train" else prepare_argv)
            + job.format("b", "train", verify, train_argv)
            + f'[[gates]]\nkind = "metrics"\nrules = [{rules}]\n'
            '[budget]\nmax_turns = 1\nmax_tokens = 1\nmax_wall_s = 1\nmax_attempts = 1\n')
    (tmp_path / "milestones").mkdir(exist_ok=True)
    path = tmp_path / "milestones" / "pair.toml"
    path.write_text(text)
    return path
