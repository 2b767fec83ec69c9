#!/usr/bin/env bash
# Jobs that outlive one device call (10 minutes at most): each runs in a session of its own, which the device tool
# leaves running until the machine goes back, and the next call (within the machine's idle window) waits for them.
#   bash bench/detached.sh start NAME CMD [ARGS...]   run CMD in the background; its stdout+stderr go to NAME.log
#   bash bench/detached.sh wait SECONDS               wait until every started job ended or SECONDS passed, then
#                                                     copy what the jobs wrote to $OUT and print one line a job
# A job's own output folder is $DETACHED/NAME.out (exported to it as JOB_OUT); what $DETACHED holds comes back.
set -u
DETACHED="${DETACHED:-/tmp/detached}"
mkdir -p "$DETACHED"
case "${1:-}" in
  start)
    name="$2"; shift 2
    mkdir -p "$DETACHED/$name.out"
    rm -f "$DETACHED/$name.rc"
    # setsid: a new session, so the job is not among the processes the device tool ends when this call returns.
    JOB_OUT="$DETACHED/$name.out" setsid bash -c '"$@" > "$0.log" 2>&1; echo $? > "$0.rc"' "$DETACHED/$name" "$@" \
      < /dev/null > /dev/null 2>&1 &
    echo "started $name: $*"
    ;;
  wait)
    deadline=$(( $(date +%s) + ${2:?seconds} ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
      running=0
      for log in "$DETACHED"/*.log; do
        [ -e "$log" ] && [ ! -e "${log%.log}.rc" ] && running=$((running + 1))
      done
      [ "$running" -eq 0 ] && break
      sleep 5
    done
    # Files under 4 MB only: logs, verdicts, tables (a judged job's checkpoints stay on the machine).
    [ -n "${OUT:-}" ] && (cd "$DETACHED" && find . -type f -size -4M -print0 | xargs -0 -r cp --parents -t "$OUT")
    for log in "$DETACHED"/*.log; do
      [ -e "$log" ] || continue
      name="$(basename "$log" .log)"
      rc="$(cat "${log%.log}.rc" 2>/dev/null || echo running)"
      printf '%-24s rc=%-8s %s\n' "$name" "$rc" "$(tail -1 "$log" | cut -c1-150)"
    done
    ;;
  *)
    echo "usage: bash bench/detached.sh start NAME CMD [ARGS...] | wait SECONDS" >&2
    exit 2
    ;;
esac
