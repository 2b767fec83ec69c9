"""How fast `guards check` is on one core: the project, and the whole installed torch package.

    python bench/guards_speed.py [--repeat 5] [--torch-repeat 2] [--cpu N] [--out results.json]

The process pins itself to one CPU (os.sched_setaffinity) before anything is timed; subprocesses
inherit the pin. Rows:

* project, in-process   - load guards.toml + check engine/ harness/ guards/ (what the rules cost)
* project, CLI          - `python -m guards check` end to end, interpreter start-up included
* torch, in-process     - every .py file of the installed torch package, all rules
* torch, parse only     - ast.parse of the same files under the same GC setting: the floor that
                          no rule can beat, measured in the same job as the baseline

Targets from the issue: the project under 2 s, torch under 60 s. Each row reports the best and the
median of its repeats, since other work on a shared machine only ever adds time.
"""

import argparse
import ast
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine.atomic_files import write_text_atomic  # noqa: E402  (needs the checkout on sys.path first)
from guards.config import load_config  # noqa: E402
from guards.runner import DEFAULT_PACKAGES, check_paths  # noqa: E402
from guards.source import iter_python_files  # noqa: E402


def _timed(fn, repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def _project_in_process() -> tuple[int, int]:
    config = load_config(REPO / "guards.toml")
    result = check_paths([REPO / p for p in DEFAULT_PACKAGES if (REPO / p).is_dir()], config, cwd=REPO)
    return result.files, len(result.findings)


def _project_cli() -> int:
    # cwd=REPO puts the checkout first on the child's sys.path, as `python -m` does for its folder
    proc = subprocess.run([sys.executable, "-m", "guards", "check"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"guards CLI failed with exit code {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.returncode


def _torch_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent


def _torch_in_process(torch_dir: Path) -> tuple[int, int]:
    result = check_paths([torch_dir], load_config(REPO / "guards.toml"), cwd=REPO)
    return result.files, len(result.findings)


def _torch_parse_only(files: list[Path]) -> int:
    threshold = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)  # the runner's setting, so the floor is comparable
    parsed = 0
    try:
        for file in files:
            try:
                ast.parse(file.read_bytes())
                parsed += 1
            except (SyntaxError, ValueError):
                continue  # the same files the runner reports as parse-error
    finally:
        gc.set_threshold(*threshold)
    return parsed


def _row(name: str, times: list[float], files: int, findings: int | None, target: float | None) -> dict:
    return {"name": name, "best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
            "repeats": len(times), "times_s": [round(t, 3) for t in times], "files": files, "findings": findings, "target_s": target,
            "meets_target": None if target is None else min(times) < target}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="repeats of the project rows (default 5)")
    parser.add_argument("--torch-repeat", type=int, default=2, help="repeats of the torch rows (default 2)")
    parser.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the first one allowed)")
    parser.add_argument("--skip-torch", action="store_true", help="only the project rows")
    parser.add_argument("--out", default="", help="also write the results as JSON to this path")
    args = parser.parse_args(argv)

    cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    load_before = os.getloadavg()

    rows = []
    times, (files, findings) = _timed(_project_in_process, args.repeat)
    rows.append(_row("project, in-process", times, files, findings, 2.0))
    times, _ = _timed(_project_cli, args.repeat)
    rows.append(_row("project, CLI (python -m guards check)", times, files, findings, 2.0))
    torch_version = None
    if not args.skip_torch:
        torch_dir = _torch_dir()
        import torch

        torch_version = torch.__version__
        times, (files, findings) = _timed(lambda: _torch_in_process(torch_dir), args.torch_repeat)
        rows.append(_row("torch, in-process (all rules)", times, files, findings, 60.0))
        torch_files = list(iter_python_files([torch_dir]))
        times, _ = _timed(lambda: _torch_parse_only(torch_files), args.torch_repeat)
        rows.append(_row("torch, ast.parse only (floor)", times, len(torch_files), None, None))

    print(f"guards speed, pinned to CPU {cpu} (load average before: {', '.join(f'{x:.2f}' for x in load_before)})")
    print(f"{'row':40} {'best s':>8} {'median s':>9} {'files':>6} {'findings':>9} {'target':>7}")
    for row in rows:
        target = f"<{row['target_s']:.0f} s" if row["target_s"] else ""
        found = "" if row["findings"] is None else str(row["findings"])
        print(f"{row['name']:40} {row['best_s']:8.3f} {row['median_s']:9.3f} {row['files']:6d} {found:>9} {target:>7}")

    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.out), json.dumps({
            "cpu": cpu, "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "python": platform.python_version(), "torch": torch_version, "machine": platform.machine(),
            "rows": rows,
        }, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(r["meets_target"] in (None, True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
