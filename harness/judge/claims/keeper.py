"""Keep checkpoints of steps the judge chose in secret, while the job runs and prunes its own.

A CPU train job saves every step and keeps only its last few (`--keep-last`) where all of them would not
fit in the judge's disk budget. The judge then draws which step pairs (N - 1, N) it will verify exactly
(harness/judge/claims/exactstep.py) with a secret of its own (never the judging seed, which a job may read in
its argv), and never tells the job: the job cannot do the full work only on the steps that get checked.

While the job runs, `poll()` hard-links EVERY complete checkpoint into the judge's own folder (outside
the job's sandbox), so that the job's pruning cannot take a chosen one away and a link says nothing
about the choice; the links of steps not chosen are dropped only once the job has saved `lag` newer
checkpoints, by when the step after them is trained and printed: a job that watches its files' link
counts learns of a choice too late to do that step honestly (and its printed line is already out).
Links, not copies: no extra disk until the job prunes its own.

A checkpoint the job pruned before the judge saw it (a step faster than the poll) is simply not kept;
which steps were verified is reported either way.
"""

import os
import re
import secrets
import shutil
from pathlib import Path

__all__ = ["CheckpointKeeper", "draw_pairs"]

_STEP_DIR = re.compile(r"^step_(\d{8})$")


def draw_pairs(num_steps: int, pairs: int) -> set[int]:
    """Steps to keep: `pairs` secret random (N - 1, N) pairs with N in 2 .. num_steps - 1 (the last pair, N =
    num_steps, stays in the job's own folder)."""
    candidates = list(range(2, num_steps))
    chosen = secrets.SystemRandom().sample(candidates, min(pairs, len(candidates)))
    return {s for n in chosen for s in (n - 1, n)}


class CheckpointKeeper:
    """Hard-links the complete checkpoints appearing in `save_dir` into `keep_dir`; keeps those of `chosen` steps."""

    def __init__(self, save_dir: Path, keep_dir: Path, chosen: set[int], lag: int = 2):
        self.save_dir, self.keep_dir, self.chosen, self.lag = Path(save_dir), Path(keep_dir), set(chosen), lag
        self.linked: dict[int, Path] = {}
        self.seen = 0

    def poll(self) -> None:
        if self.save_dir.is_dir():
            for entry in os.scandir(self.save_dir):
                m = _STEP_DIR.match(entry.name)
                if m and int(m.group(1)) not in self.linked and entry.is_dir(follow_symlinks=False):
                    self._link(int(m.group(1)), Path(entry.path))
        for step in [s for s in self.linked if s not in self.chosen and s < self.seen - self.lag]:
            shutil.rmtree(self.linked.pop(step))

    def _link(self, step: int, folder: Path) -> None:
        if not ((folder / ".metadata").is_file() and (folder / "meta.json").is_file()):
            return  # still being written (the engine renames a complete .tmp folder into place)
        target = self.keep_dir / folder.name
        target.mkdir(parents=True, exist_ok=True)
        try:
            for file in folder.iterdir():
                if file.is_file() and not file.is_symlink():
                    os.link(file, target / file.name)
        except FileNotFoundError:  # pruned while linking: this step is lost (the verdict reports the steps verified)
            shutil.rmtree(target)
            return
        self.linked[step] = target
        self.seen = max(self.seen, step)

    def paths(self) -> list[Path]:
        """The kept checkpoints, oldest first."""
        return [self.linked[s] for s in sorted(self.linked)]
