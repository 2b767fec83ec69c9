"""Produce milestones/long-horizon/refs/tiny-minicpm4-corpus-loss.jsonl: the committed reference run.

It runs the two jobs of milestones/long-horizon.toml exactly as the judge does (their argv is read from the
TOML, placeholders filled the same way: {data} = TEMPER_DATA or ../shared/data beside this checkout,
{job_dir} = a temp folder, {job_dir:prepare} = the prepare job's folder) with the engine of this checkout,
and writes the [LOSS] lines of the train job as JSONL after a {"_meta": {...}} line. Produce it at main:

    git checkout main && PYTHONPATH=. python milestones/long-horizon/make_reference.py
"""

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "milestones" / "long-horizon.toml"
OUT = Path(__file__).resolve().parent / "refs" / "tiny-minicpm4-corpus-loss.jsonl"
LOSS = re.compile(r"^\[LOSS\] step=(\d+) global_loss=(\S+) grad_norm=(\S+) lr=(\S+) tokens=(\d+) ")


def main() -> int:
    sys.path.insert(0, str(REPO))
    from harness.settings import data_dir
    from harness.spec import render_argv

    spec = tomllib.loads(SPEC.read_text(encoding="utf-8"))
    jobs = {g["name"]: g for g in spec["gates"] if g["kind"] == "job"}
    data = data_dir(REPO)
    if not data.is_dir():
        raise SystemExit(f"{data} is not a folder: set TEMPER_DATA to the shared data folder")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        dirs: dict[str, Path] = {}
        stdout = ""
        for name in ("prepare", "train"):
            dirs[name] = Path(tmp) / name
            dirs[name].mkdir()
            argv = render_argv(jobs[name]["argv"], job_dir=dirs[name], worktree=REPO, job_dirs=dirs, data=data)
            print("+ python -m engine", " ".join(argv), flush=True)
            proc = subprocess.run([sys.executable, "-m", "engine", *argv], cwd=REPO, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
            stdout = proc.stdout
    rows = []
    for line in stdout.splitlines():
        if m := LOSS.match(line):
            rows.append({"step": int(m[1]), "global_loss": float(m[2]), "grad_norm": float(m[3]), "lr": float(m[4]),
                         "tokens": int(m[5])})
    meta = {"_meta": {
        "what": "the engine's own run of milestones/long-horizon.toml's jobs (prepare + pretrain), the reference of its "
                "loss_mean_rel_diff rule",
        "command": "PYTHONPATH=. python milestones/long-horizon/make_reference.py",
        "engine_commit": commit, "argv": {n: jobs[n]["argv"] for n in ("prepare", "train")},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()},
        "seed": 1234, "device": "cpu",
    }}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(json.dumps(r) for r in [meta, *rows]) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} ({len(rows)} steps; final loss {rows[-1]['global_loss']:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
