#!/usr/bin/env bash
# One device call (2 GPUs) for the exact-step check's bf16 / FP8 floor (harness/judge/claims/exactstep.py):
#   GPU 0: `temper gate fp8-parity` on this tree (bench/device_gates.sh; its run record even when cut short)
#   GPU 1: the milestone's own jobs, 300 steps at seed $SEED, saving steps 299 and 300 as the judge asks: bf16,
#          --fp8 tensorwise, and --fp8 tensorwise with the planted wrong scale (tests/milestones/regressions/
#          fp8-parity.patch applied to a copy of this tree); then bench/exactstep_floor.py on each (per tensor:
#          the engine, the judge's own pass, half the batch, the next batch; and verify_exact_steps' verdicts).
# VERDICTS=1 adds verify_exact_steps' own verdicts to each per-tensor measurement (~2.5x its time).
# GATES="main regression" also judges the planted regression (on GPU 1; a full judging needs ~300 s on an H200).
#   DATA=/path/to/shared/data WHEELS=/path/to/wheels bash bench/exactstep_session.sh
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/exactstep-session}"
mkdir -p "$OUT"
SEED="${SEED:-98}"
GATE_S="${GATE_S:-225}"  # each judging's limit
JOB_S="${JOB_S:-140}"    # each of the three jobs'
FLOOR_S="${FLOOR_S:-80}" # each per-tensor measurement's (too short with three at once beside a judging: give the
# measurement a call of its own, or FLOOR_S=200 and GATES= ; measured 2026-11-27: the three jobs 153 s on one H200)
read -r -a GATES <<< "${GATES-main}"
gate_pids=()
stamp() { echo "=== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 2
export PYTHONPATH="$PWD:/tmp/site"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
for which in "${GATES[@]}"; do
  gpu=0; arg=fp8-parity
  [ "$which" = regression ] && gpu=1 && arg="fp8-parity=tests/milestones/regressions/fp8-parity.patch"
  (CUDA_VISIBLE_DEVICES=$gpu TEMPER_DATA="$DATA" OUT="/tmp/gate-$which" timeout "$GATE_S" \
     bash bench/device_gates.sh "$arg" > "/tmp/gate-$which.txt" 2>&1) &
  gate_pids+=($!)
done

stamp "prepare (the milestone's corpus file)"
python3 -m engine prepare --preset minicpm4-0.5b --tokenizer-path "$DATA/tokenizers/minicpm4" \
  --hf-dataset "$DATA/corpus/train-00000-of-00002.parquet" --hf-val-dataset "$DATA/corpus/validation-00000-of-00001.parquet" \
  --hf-val-split train --num-proc 6 --out /tmp/shards 2>&1 | tail -1
rm -rf /tmp/regr && mkdir /tmp/regr && tar --exclude=./.git -cf - . | tar -xf - -C /tmp/regr
(cd /tmp/regr && git apply tests/milestones/regressions/fp8-parity.patch) || { echo "the planted regression does not apply"; exit 2; }

# the milestone's argv (milestones/fp8-parity.toml) with the judge's save plan for a GPU job (claims/saveplan.py)
job() {  # name, extra flags...
  local name=$1; shift
  echo pretrain --preset minicpm4-0.5b --device cuda --seed "$SEED" --tokenizer-path "$DATA/tokenizers/minicpm4" \
    --data-path /tmp/shards --seq-length 1024 --micro-batch-size 4 --global-batch-size 4 --num-steps 300 \
    --warmup-steps 30 --eval-samples 0 --op-attention baseline --op-rmsnorm baseline --op-gemm-fc1 baseline \
    --op-gemm-output baseline --op-rope baseline "$@" --run-dir "/tmp/job-$name" \
    --save-dir "/tmp/job-$name/checkpoints" --save-last 2 --keep-last 3 --save-final
}
stamp "jobs on GPU 1: bf16, fp8 tensorwise, fp8 tensorwise with the wrong scale"
pids=()
for name in bf16 fp8 wrong; do
  extra=(); [ "$name" != bf16 ] && extra=(--fp8 tensorwise)
  tree=$PWD; [ "$name" = wrong ] && tree=/tmp/regr
  (cd "$tree" && CUDA_VISIBLE_DEVICES=1 PYTHONPATH="$tree:/tmp/site" timeout "$JOB_S" python3 -m engine $(job "$name" "${extra[@]}") \
     > "/tmp/job-$name.log" 2>&1; echo "rc=$?" >> "/tmp/job-$name.log") &
  pids+=($!)
done
wait "${pids[@]}"
for name in bf16 fp8 wrong; do stamp "job $name"; grep "^\[LOSS\] step=300 " "/tmp/job-$name.log"; tail -1 "/tmp/job-$name.log"; done
stamp "per tensor (GPU 1)"
pids=()
for name in bf16 fp8 wrong; do
  extra=(); [ "$name" != bf16 ] && extra=(--fp8 tensorwise)
  (CUDA_VISIBLE_DEVICES=1 timeout "$FLOOR_S" python3 bench/exactstep_floor.py --label "$name" --out "$OUT/floor_$name.json" \
     ${VERDICTS:+--verdicts} -- \
     $(job "$name" "${extra[@]}") > "/tmp/floor-$name.txt" 2>&1) &
  pids+=($!)
done
wait "${pids[@]}"
stamp "waiting for the judgings"
wait "${gate_pids[@]}"
for which in "${GATES[@]}"; do
  cp "/tmp/gate-$which/"*.json "$OUT/" 2>/dev/null
  find "/tmp/gate-$which/runs" -name events.jsonl -exec cp {} "$OUT/events_$which.jsonl" \;
done
tar -czf "$OUT/logs.tgz" -C /tmp --exclude='*/checkpoints' gate-main.txt gate-regression.txt gate-main gate-regression \
  job-bf16.log job-fp8.log job-wrong.log floor-bf16.txt floor-fp8.txt floor-wrong.txt 2>/dev/null
stamp "table"
for which in "${GATES[@]}"; do
  echo "-- gate $which (events):"
  python3 -c "
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e['type'] == 'gate_result':
        r = e['result']; print(' ', r['name'], 'PASS' if r['passed'] else 'FAIL', r['summary'][:120], {k: round(v, 4) for k, v in r['metrics'].items()})
        for v in r['violations'][:2]: print('    -', v[:600])
    if e['type'] == 'run_finished': print('  verdict:', e['status'], e['reason'][:300])
" "$OUT/events_$which.jsonl" 2>&1 | tail -14
done
for name in bf16 fp8 wrong; do cat "/tmp/floor-$name.txt" | tail -14; done
