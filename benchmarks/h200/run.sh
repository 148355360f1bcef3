#!/usr/bin/env bash
# The H200 study of `transformers serve` (issue: real GPU, capped memory), in one or two commands:
#   bash benchmarks/h200/run.sh OUT_DIR [tune|compare|all]
# Needs the cp312 wheels the machine lacks in .whl/ (optuna + deps, plotly, fastapi + deps for
# transformers serve) unless /tmp/site already holds them. Writes the study database,
# report.html, best.env and summary JSON to OUT_DIR. A study database in .h200/study.db (from an
# earlier call) is resumed.
# SHAPE (llama-3.2-1b; or llama-3.2-3b, llama-3.1-8b), MODEL (/tmp/m1b, /tmp/m3b, /tmp/m8b), STUDY, TRIALS (12: measured
# configs), PICK (max-throughput: the pick tune confirms and exports, and the side by side runs), CAP (24GiB), STUDIES (/tmp/studies), WORKLOAD (benchmarks/h200/workload.yaml). The GPU:
# CUDA_VISIBLE_DEVICES (one index).
# Dry run on the built-in simulator (no GPU, infinilm space): SIMULATE=h200.
# TUNE_S counts from the tune's start: the wheel install and model build come first (about a
# minute for the 8B shape), and a device call killed at its own limit returns no study.db, so
# keep TUNE_S about 90 s under that limit (r33's call 1 lost its study.db and log that way).
set -u
OUT=${1:?usage: run.sh OUT_DIR [tune|compare|all]}
STAGE=${2:-all}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HOME=/tmp/hf TRANSFORMERS_VERBOSITY=error
export CUDA_DEVICE_ORDER=PCI_BUS_ID
mkdir -p /tmp/hf/hub
[ -n "${SIMULATE:-}" ] || [ -d /tmp/site/optuna ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
SHAPE=${SHAPE:-llama-3.2-1b}
TAG=${SHAPE##*-}
M=${MODEL:-/tmp/m$TAG}
CAP=${CAP:-24GiB}
STUDY=${STUDY:-h200-transformers-$TAG-cap${CAP%GiB}}
STUDIES=${STUDIES:-/tmp/studies}
if [ -n "${SIMULATE:-}" ]; then
  M=models/$SHAPE
  COMMON=(--model $M --space search_spaces/infinilm.yaml --simulate "$SIMULATE")
else
  COMMON=(--model $M --space search_spaces/transformers.yaml)
  python3 benchmarks/h200/mkmodel.py $M --shape "$SHAPE" || exit 1
fi
COMMON+=(--workload ${WORKLOAD:-benchmarks/h200/workload.yaml})
mkdir -p $STUDIES/$STUDY
[ -f $STUDIES/$STUDY/study.db ] || [ ! -f .h200/study.db ] || cp .h200/study.db $STUDIES/$STUDY/study.db
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
  python3 -c "import sys,torch,transformers,optuna;print('python',sys.version.split()[0],'torch',torch.__version__,'transformers',transformers.__version__,'optuna',optuna.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "$STAGE" = tune ] || [ "$STAGE" = all ]; then
  timeout -s INT -k 60 ${TUNE_S:-36000} python3 -m tuner.cli tune "${COMMON[@]}" --trials ${TRIALS:-12} --study $STUDY --studies-dir $STUDIES \
    --gpu-memory-cap $CAP --stall-timeout 60 --startup-timeout 180 --sampler ${SAMPLER:-auto} --pick ${PICK:-max-throughput} 2>&1 | stdbuf -oL tr '\r' '\n' | grep --line-buffered -v '^ *[0-9]*%|' | tee "$OUT/tune.log"
  cp $STUDIES/$STUDY/study.db "$OUT/study.db"
  python3 -m tuner.cli inspect --study $STUDY --studies-dir $STUDIES --no-report > "$OUT/inspect.txt" 2>&1
fi
if [ "$STAGE" = compare ] || [ "$STAGE" = all ]; then
  timeout -s INT -k 30 ${COMPARE_S:-36000} python3 benchmarks/h200/side_by_side.py "${COMMON[@]}" \
    --study $STUDY --studies-dir $STUDIES --gpu-memory-cap $CAP --repeats 3 --pick ${PICK:-max-throughput} \
    -o "$OUT/side_by_side.json" 2>&1 | tee "$OUT/compare.log"
  python3 -m tuner.cli export --study $STUDY --studies-dir $STUDIES --pick ${PICK:-max-throughput} -o "$OUT/best.env"
  python3 -m tuner.cli inspect --study $STUDY --studies-dir $STUDIES --format json --report "$OUT/report.html" > "$OUT/inspect.json"
  cp $STUDIES/$STUDY/study.db "$OUT/study.db"
fi
