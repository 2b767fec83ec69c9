#!/usr/bin/env bash
# One-GPU commands spread over a machine's GPUs: a worker per GPU takes the next line of the queue file when its
# last command ends (so long and short ones balance themselves), under CUDA_VISIBLE_DEVICES=that GPU.
#   bash bench/gpu_queue.sh bench/queues/judge-gpu.txt            # every GPU nvidia-smi lists
#   GPUS="1 2 3" bash bench/gpu_queue.sh QUEUE                     # these GPUs only
# A queue file holds one bash command a line (blank lines and '#' comments skipped), longest first. Command i's output
# goes to DIR/queue/i.log (DIR: $JOB_OUT, else $OUT); DIR/queue/table.txt (printed last) has one row a command: gpu, exit code, seconds.
set -u
queue_file="${1:?usage: bash bench/gpu_queue.sh QUEUE_FILE}"
OUT="${JOB_OUT:-${OUT:-$PWD/gpu-queue}}"  # under bench/detached.sh: its job folder (the device empties $OUT each call)
dir="$OUT/queue"
mkdir -p "$dir"
read -r -a gpus <<< "${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | tr '\n' ' ')}"
grep -v -e '^\s*#' -e '^\s*$' "$queue_file" | nl -ba -w1 -s$'\t' > "$dir/pending"
: > "$dir/rows"
take() {  # the next "index<TAB>command" line, removed from the queue under a lock
  flock "$dir/pending" bash -c 'head -1 "$0"; sed -i 1d "$0"' "$dir/pending"
}
worker() {
  local gpu="$1" line i cmd t0 rc
  while line="$(take)" && [ -n "$line" ]; do
    i="${line%%$'\t'*}"; cmd="${line#*$'\t'}"; t0=$(date +%s)
    echo "=== $(date +%T) gpu $gpu: [$i] $cmd"
    CUDA_VISIBLE_DEVICES="$gpu" bash -c "$cmd" > "$dir/$i.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\t%s\n' "$i" "$gpu" "$rc" "$(( $(date +%s) - t0 ))" "$cmd" >> "$dir/rows"
    echo "=== $(date +%T) gpu $gpu: [$i] rc=$rc"
  done
}
for gpu in "${gpus[@]}"; do worker "$gpu" & done
wait
{ printf '%-3s %-3s %-4s %6s  %s\n' "#" gpu rc s command
  sort -n "$dir/rows" | while IFS=$'\t' read -r i gpu rc s cmd; do
    printf '%-3s %-3s %-4s %6s  %s\n' "$i" "$gpu" "$rc" "$s" "${cmd:0:140}"
  done; } | tee "$dir/table.txt"
