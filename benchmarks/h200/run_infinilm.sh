#!/usr/bin/env bash
# The H200 study of real InfiniLM (issue: the seed's own server), stage by stage:
#   INFINILM_ENV=FILE bash benchmarks/h200/run_infinilm.sh OUT_DIR [main|ablate|capped|compare|all]
# INFINILM_ENV is a shell file that makes `python3 -m infinilm.server.inference_server` work
# (PYTHONPATH, LD_LIBRARY_PATH, LD_PRELOAD of the system libstdc++); InfiniLM itself is built and
# installed by you, not by this repository.  Needs the cp312 wheels the machine lacks in .whl/.
#  main     the shipped search_spaces/infinilm.yaml, unchanged, on the whole card (TRIALS, 10)
#  ablate   one knob at a time around main's knee: do the seed-patch variables act?
#  capped   --gpu-memory-cap 12GiB (a ballast holds the rest), KV range widened past what fits,
#           no pre-screen: start-up failures of oversized pools and OOMs under load
#  compare  InfiniLM's defaults versus main's max-throughput pick, alternating, REPEATS (2) each
# Every stage copies what it produced to OUT_DIR as soon as it ends.
# Dry run of the same commands on the built-in simulator (no GPU, no InfiniLM): SIMULATE=h200.
set -u
OUT=${1:?usage: run_infinilm.sh OUT_DIR [main|ablate|capped|compare|all]}
STAGE=${2:-all}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 TRANSFORMERS_VERBOSITY=error
STUDIES=${STUDIES:-/tmp/studies}
MAIN=infinilm-h200-1b
CAPPED=infinilm-h200-1b-cap12
WORKLOAD=benchmarks/h200/workload.yaml
if [ -n "${SIMULATE:-}" ]; then
  M=models/llama-3.2-1b
  COMMON=(--model $M --workload $WORKLOAD --simulate "$SIMULATE")
else
  : "${INFINILM_ENV:?set INFINILM_ENV to the file that puts InfiniLM on PYTHONPATH}"
  . "$INFINILM_ENV"
  [ -d /tmp/site/optuna ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
  M=/tmp/m1b
  COMMON=(--model $M --workload $WORKLOAD)
  python3 benchmarks/h200/mkmodel.py $M --shape llama-3.2-1b || exit 1
fi
tuner() { python3 -m tuner.cli "$@" 2>&1 | stdbuf -oL tr '\r' '\n' | grep -v -E '^ *[0-9]+%\|'; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys,torch,transformers,optuna;print('python',sys.version.split()[0],'torch',torch.__version__,'transformers',transformers.__version__,'optuna',optuna.__version__)"
  [ -z "${INFINILM_SRC:-}" ] || git -C "$INFINILM_SRC" log -1 --format="infinilm %H" 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
has() { [ "$STAGE" = all ] || [ "$STAGE" = "$1" ]; }

if has main; then
  tuner tune "${COMMON[@]}" --stall-timeout 20 --space search_spaces/infinilm.yaml --trials ${TRIALS:-10} \
    --study $MAIN --studies-dir $STUDIES --sampler ${SAMPLER:-auto} | tee "$OUT/tune_main.log"
  tuner inspect --study $MAIN --studies-dir $STUDIES --format json --report "$OUT/report.html" > "$OUT/inspect.json"
  tuner inspect --study $MAIN --studies-dir $STUDIES --no-report > "$OUT/inspect.txt"
  tuner export --study $MAIN --studies-dir $STUDIES -o "$OUT/best.env"
  cp $STUDIES/$MAIN/study.db "$OUT/study.db"
fi
if has ablate; then
  tuner ablate "${COMMON[@]}" --space search_spaces/infinilm.yaml --study $MAIN --studies-dir $STUDIES \
    --knobs prefill_batch_cap,decode_batch_cap,long_context_threshold,decode_first_when_running,max_batch_size \
    --per-knob 1 -o "$OUT/ablation.json" | tee "$OUT/ablate.log"
fi
if has capped; then
  # the shipped space with the KV range fixed at up to 1M tokens (32 GiB of KV for this model):
  # far past what a 12 GiB card holds, so that the sampler proposes pools that cannot fit
  sed 's/high: auto,/high: 1048576,/' search_spaces/infinilm.yaml > /tmp/infinilm_wide.yaml
  printf 'kv_cache_tokens: 1048576\nblock_size: 256\n' > /tmp/seed_oversized.yaml
  printf 'kv_cache_tokens: 262144\nblock_size: 256\nmax_batch_size: 128\nmax_num_batched_tokens: 32768\n' \
    > /tmp/seed_edge.yaml
  tuner tune "${COMMON[@]}" --stall-timeout 20 --space /tmp/infinilm_wide.yaml --trials ${CAPPED_TRIALS:-6} \
    --study $CAPPED --studies-dir $STUDIES --gpu-memory-cap 12GiB --no-prescreen \
    --seed-config /tmp/seed_oversized.yaml --seed-config /tmp/seed_edge.yaml | tee "$OUT/tune_capped.log"
  tuner inspect --study $CAPPED --studies-dir $STUDIES --no-report > "$OUT/capped_inspect.txt"
  cp $STUDIES/$CAPPED/study.db "$OUT/capped_study.db"
  cp /tmp/infinilm_wide.yaml "$OUT/capped_space.yaml"
  for d in $STUDIES/$CAPPED/trials/*/; do
    n=$(basename "$d"); tail -n 5 "$d/server.log" 2>/dev/null | sed "s/^/[trial $n] /"
  done > "$OUT/capped_server_tails.txt"
fi
if has compare; then
  python3 benchmarks/h200/side_by_side.py "${COMMON[@]}" --space search_spaces/infinilm.yaml \
    --study $MAIN --studies-dir $STUDIES --repeats ${REPEATS:-2} --pick max-throughput \
    -o "$OUT/side_by_side.json" 2>&1 | tee "$OUT/side_by_side.log"
fi
