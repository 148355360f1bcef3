#!/usr/bin/env bash
# Issue 15: the seed's patched InfiniLM scheduler (PR #495), Llama-3.1-8B shape, 24 GiB cap:
#   INFINILM_ENV=FILE bash benchmarks/h200/run_infinilm_seed.sh OUT_DIR [study|ablate|compare|all]
# INFINILM_ENV: a shell file that makes `python3 -m infinilm.server.inference_server` importable
# (the patched InfiniLM is built by you, not by this repository).  MODEL: a Llama-3.1-8B-shaped
# model dir (benchmarks/h200/mkmodel.py --shape llama-3.1-8b); made there if missing.
#  study    tune on the patched server under --gpu-memory-cap 24GiB; the server's defaults, the
#           seed's hand config (64 x 256 blocks) and the same with 80 and 96 blocks run first
#  ablate   one knob at a time around the seed's hand config: are the caps and decode-first live?
#  compare  default / seed / tuned, alternating, REPEATS (3) each (side_by_side.py)
# TUNE_ARGS: more `tune` flags for the study stage (e.g. --kv-absolute to resume a study whose
# first trials drew the KV pool as an absolute size, before the KV share).
# Time limits (seconds, for a GPU lease): STUDY_S, ABLATE_S, COMPARE_S; a stage stopped by its
# limit is interrupted like Ctrl-C (the study is resumable) and keeps what it finished.
# Every stage copies what it produced to OUT_DIR as soon as it ends.
# Dry run on the built-in simulator (no GPU, no InfiniLM): SIMULATE=rtx4090 or SIMULATE=h200.
set -u
OUT=${1:?usage: run_infinilm_seed.sh OUT_DIR [study|ablate|compare|all]}
STAGE=${2:-all}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 TRANSFORMERS_VERBOSITY=error
STUDIES=${STUDIES:-/tmp/studies}
STUDY=${STUDY:-infinilm-seed-8b-cap24}
WORKLOAD=benchmarks/h200/workload-seed8b.yaml
CAP=24GiB
mkdir -p "$STUDIES"
if [ -n "${SIMULATE:-}" ]; then
  M=${MODEL:-models/llama-3.1-8b}
  COMMON=(--model "$M" --workload $WORKLOAD --gpu-memory-cap $CAP --simulate "$SIMULATE")
else
  : "${INFINILM_ENV:?set INFINILM_ENV to the file that puts InfiniLM on PYTHONPATH}"
  . "$INFINILM_ENV"
  M=${MODEL:-/tmp/m8b}
  COMMON=(--model "$M" --workload $WORKLOAD --gpu-memory-cap $CAP)
  [ -f "$M/config.json" ] || python3 benchmarks/h200/mkmodel.py "$M" --shape llama-3.1-8b || exit 1
fi
# The experiment's space: the shipped one, the decode cap's low end raised to 8 (a cap of 1-7
# serves 64 streams a few at a time: minutes per trial in a 30-minute lease; 8 is the seed's
# static baseline).  Written once, so that every stage sees the same space fingerprint.
SPACE=$STUDIES/seed_space.yaml
[ -f "$SPACE" ] || python3 - search_spaces/infinilm.yaml "$SPACE" <<'EOF' || exit 1
import sys, yaml
raw = yaml.safe_load(open(sys.argv[1]))
raw["parameters"]["decode_batch_cap"]["low"] = 8
yaml.safe_dump(raw, open(sys.argv[2], "w"), sort_keys=False)
EOF
# the seed report's hand config, and the same with the KV pools it saw fail (80, 96 blocks)
seed_cfg() {
  printf 'kv_cache_tokens: %s\nblock_size: 256\nmax_batch_size: 64\nenable_graph: true\n' "$1"
  printf 'prefill_batch_cap: 8\ndecode_batch_cap: 24\nlong_context_threshold: 4096\n'
  printf 'long_context_max_batch: 1\ndecode_first_when_running: true\n'
}
seed_cfg 16384 > "$STUDIES/seed.yaml"
seed_cfg 20480 > "$STUDIES/seed80.yaml"
seed_cfg 24576 > "$STUDIES/seed96.yaml"
tuner() { python3 -m tuner.cli "$@" 2>&1 | stdbuf -oL tr '\r' '\n' | grep --line-buffered -v -E '^ *[0-9]+%\|'; }
limited() { local s=$1; shift; timeout -s INT -k 60 "$s" "$@"; }
has() { [ "$STAGE" = all ] || [ "$STAGE" = "$1" ]; }
cp "$STUDIES"/seed*.yaml "$OUT"/

if has study; then
  limited "${STUDY_S:-3600}" python3 -m tuner.cli tune "${COMMON[@]}" --space "$SPACE" \
    --trials "${TRIALS:-20}" --study $STUDY --studies-dir $STUDIES --stall-timeout 30 \
    --startup-timeout 240 --sampler "${SAMPLER:-auto}" --seed-config "$STUDIES/seed.yaml" \
    --seed-config "$STUDIES/seed80.yaml" --seed-config "$STUDIES/seed96.yaml" ${TUNE_ARGS:-} 2>&1 \
    | stdbuf -oL tr '\r' '\n' | grep --line-buffered -v -E '^ *[0-9]+%\|' | tee -a "$OUT/tune.log"
  cp $STUDIES/$STUDY/study.db "$OUT/study.db"
  tuner export --study $STUDY --studies-dir $STUDIES -o "$OUT/best.env" > /dev/null
  tuner inspect --study $STUDY --studies-dir $STUDIES --no-report > "$OUT/inspect.txt"
  for d in "$STUDIES/$STUDY"/trials/*/; do
    [ -f "$d/server.log" ] && grep -n -E -i 'error|out of memory|cudaMalloc|RankWorker|failed' "$d/server.log" \
      | head -n 8 | sed "s|^|[trial $(basename "$d")] |"
  done > "$OUT/server_errors.txt"
fi
# ablate around the study's trial of the seed's hand config (if it ran healthy)
seed_trial() {
  python3 - "$STUDIES/$STUDY/study.db" $STUDY <<'EOF'
import sys, optuna
from tuner.study.record import records
optuna.logging.set_verbosity(optuna.logging.WARNING)
s = optuna.load_study(study_name=sys.argv[2], storage=f"sqlite:///{sys.argv[1]}")
want = {"kv_cache_tokens": 16384, "block_size": 256, "decode_batch_cap": 24, "prefill_batch_cap": 8}
seed = [r for r in records(s) if all(r.params.get(k) == v for k, v in want.items())]
print(f"--trial {seed[0].number}" if seed and seed[0].outcome == "ok" else "--pick max-throughput")
EOF
}
if has ablate; then
  limited "${ABLATE_S:-3600}" python3 -m tuner.cli ablate "${COMMON[@]}" --space "$SPACE" \
    --study $STUDY --studies-dir $STUDIES $(seed_trial) --per-knob 1 \
    --knobs "${ABLATE_KNOBS:-decode_batch_cap,prefill_batch_cap,decode_first_when_running,long_context_max_batch}" \
    -o "$OUT/ablation.json" 2>&1 | stdbuf -oL tr '\r' '\n' | tee "$OUT/ablate.log"
fi
if has compare; then
  limited "${COMPARE_S:-3600}" python3 benchmarks/h200/side_by_side.py "${COMMON[@]}" --space "$SPACE" \
    --study $STUDY --studies-dir $STUDIES --repeats "${REPEATS:-3}" --pick "${PICK:-max-throughput}" \
    --config seed="$STUDIES/seed.yaml" -o "$OUT/side_by_side.json" 2>&1 | tee "$OUT/side_by_side.log"
fi
