#!/usr/bin/env bash
# Issue 19 part 4: one study, two workers, each server on its own GPU (`tuner tune --gpus 0,1`),
# then the same configs on one GPU (`--gpus 0`) for the wall time:
#   bash benchmarks/h200/run_two_gpu.sh OUT_DIR [two|one|all]
#  two  12 measured trials (TRIALS) with --gpus 0,1 on the journal storage, while
#       gpu_procs.py samples NVML's compute processes; then gpu_procs.py check maps every trial's
#       server to the GPU it ran on and to the worker that ran it
#  one  the configs the two-GPU study measured, queued in order (--seed-config) into a new study
#       run by one worker on GPU 0, --no-defaults (the two-GPU study's trial 0 was the defaults)
# transformers serve, Llama-3.2-1B shape (benchmarks/h200/mkmodel.py), under --gpu-memory-cap
# 24GiB (the launcher caps itself; no ballast), workload benchmarks/h200/workload.yaml.
# Dry run on the built-in simulator (no GPU, infinilm space): SIMULATE=h200.
set -u -o pipefail
OUT=${1:?usage: run_two_gpu.sh OUT_DIR [two|one|all]}
STAGE=${2:-all}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HOME=/tmp/hf \
  TRANSFORMERS_VERBOSITY=error CUDA_DEVICE_ORDER=PCI_BUS_ID
STUDIES=${STUDIES:-/tmp/studies}
TRIALS=${TRIALS:-12}
TWO=h200-two-gpu-1b; ONE=h200-one-gpu-1b
J2=journal:$STUDIES/$TWO/journal.log; J1=journal:$STUDIES/$ONE/journal.log
if [ -n "${SIMULATE:-}" ]; then
  COMMON=(--model models/llama-3.2-1b --space search_spaces/infinilm.yaml --simulate "$SIMULATE")
else
  M=${MODEL:-/tmp/m1b}
  [ -f "$M/config.json" ] || python3 benchmarks/h200/mkmodel.py "$M" --shape llama-3.2-1b || exit 1
  COMMON=(--model "$M" --space search_spaces/transformers.yaml)
fi
COMMON+=(--workload benchmarks/h200/workload.yaml --gpu-memory-cap 24GiB --studies-dir "$STUDIES"
         --stall-timeout 60 --startup-timeout 180 --sampler "${SAMPLER:-auto}" --no-export)
tuner() { python3 -m tuner.cli "$@" 2>&1 | stdbuf -oL tr '\r' '\n' | grep --line-buffered -v -E '^ *[0-9]+%\|'; }
has() { [ "$STAGE" = all ] || [ "$STAGE" = "$1" ]; }
timed() {  # LABEL CMD...: wall seconds of CMD into $OUT/wall.txt
  local label=$1 t0; shift; t0=$(date +%s.%N)
  "$@"; local rc=$?
  echo "$label rc=$rc wall_s=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")" | tee -a "$OUT/wall.txt"
}
trials_table() {  # STORAGE STUDY: one line per trial (state, outcome, worker, start, seconds)
  python3 - "$1" "$2" <<'EOF'
import sys, optuna
from tuner.study.storage import as_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
s = optuna.load_study(study_name=sys.argv[2], storage=as_storage(sys.argv[1]))
for t in s.trials:
    d = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None
    a = t.user_attrs
    print(t.number, t.state.name, a.get("outcome"), a.get("worker"), t.datetime_start, d,
          (t.values or [None])[0], dict(t.params), sep="\t")
EOF
}
if has two; then
  S=
  if [ -z "${SIMULATE:-}" ]; then
    python3 benchmarks/h200/gpu_procs.py sample "$OUT/nvml_samples.jsonl" & S=$!
  fi
  timed two_gpus tuner tune "${COMMON[@]}" --trials "$TRIALS" --study $TWO --storage "$J2" \
    --gpus 0,1 | tee "$OUT/tune_two.log"
  [ -n "$S" ] && { kill -TERM $S; wait $S; }
  trials_table "$J2" $TWO > "$OUT/trials_two.tsv"
  cp "$STUDIES/$TWO/journal.log" "$OUT/journal_two.log"
  [ -n "$S" ] && python3 benchmarks/h200/gpu_procs.py check "$OUT/nvml_samples.jsonl" \
    --storage "$J2" --study $TWO -o "$OUT/nvml_check.json" | tee "$OUT/nvml_check.txt"
  tuner inspect --storage "$J2" --study $TWO --studies-dir "$STUDIES" --no-report > "$OUT/inspect_two.txt"
fi
if has one; then
  # the two-GPU study's measured configs, in trial order, as seed configs for one GPU
  mkdir -p "$STUDIES/seeds-one"; rm -f "$STUDIES"/seeds-one/*.json
  python3 - "$J2" $TWO "$STUDIES/seeds-one" <<'EOF' || exit 1
import json, sys, optuna
from tuner.study.storage import as_storage
from tuner.study.record import KV_SHARE, records
optuna.logging.set_verbosity(optuna.logging.WARNING)
s = optuna.load_study(study_name=sys.argv[2], storage=as_storage(sys.argv[1]))
done = [r for r in records(s) if r.state.name == "COMPLETE" and not r.unmeasured]
for i, r in enumerate(sorted(done, key=lambda r: r.number)):
    open(f"{sys.argv[3]}/{i:02d}-trial{r.number}.json", "w").write(json.dumps({k: v for k, v in r.params.items() if k != KV_SHARE}))
print(f"{len(done)} measured configs of {sys.argv[2]} queued for one GPU")
EOF
  SEEDS=(); for f in "$STUDIES"/seeds-one/*.json; do SEEDS+=(--seed-config "$f"); done
  timed one_gpu tuner tune "${COMMON[@]}" --trials "$TRIALS" --study $ONE --storage "$J1" \
    --gpus 0 --no-defaults "${SEEDS[@]}" | tee "$OUT/tune_one.log"
  trials_table "$J1" $ONE > "$OUT/trials_one.tsv"
  cp "$STUDIES/$ONE/journal.log" "$OUT/journal_one.log"
fi
cat "$OUT/wall.txt" 2>/dev/null
