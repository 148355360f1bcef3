#!/usr/bin/env bash
# The H200 study of `transformers serve` (issue: real GPU, capped memory), in one or two commands:
#   bash benchmarks/h200/run.sh OUT_DIR [tune|compare|all]
# Needs the cp312 wheels the machine lacks in .whl/ (optuna + deps, plotly, fastapi + deps for
# transformers serve). Writes the study database, report.html, best.env and summary JSON to OUT_DIR.
# A study database in .h200/study.db (from an earlier call) is resumed.
set -u
OUT=${1:?usage: run.sh OUT_DIR [tune|compare|all]}
STAGE=${2:-all}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HOME=/tmp/hf TRANSFORMERS_VERBOSITY=error
mkdir -p /tmp/hf/hub
[ -d /tmp/site/optuna ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
M=/tmp/m1b
STUDY=h200-transformers-1b-cap24
STUDIES=/tmp/studies
CAP=24GiB
COMMON=(--model $M --space search_spaces/transformers.yaml --workload benchmarks/h200/workload.yaml)
python3 benchmarks/h200/mkmodel.py $M --shape llama-3.2-1b || exit 1
mkdir -p $STUDIES/$STUDY
[ -f $STUDIES/$STUDY/study.db ] || [ ! -f .h200/study.db ] || cp .h200/study.db $STUDIES/$STUDY/study.db
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys,torch,transformers,optuna;print('python',sys.version.split()[0],'torch',torch.__version__,'transformers',transformers.__version__,'optuna',optuna.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "$STAGE" = tune ] || [ "$STAGE" = all ]; then
  python3 -m tuner.cli tune "${COMMON[@]}" --trials ${TRIALS:-12} --study $STUDY --studies-dir $STUDIES \
    --gpu-memory-cap $CAP --stall-timeout 60 --startup-timeout 180 --sampler ${SAMPLER:-auto} 2>&1 | tr '\r' '\n' | grep -v '^ *[0-9]*%|' 
  cp $STUDIES/$STUDY/study.db "$OUT/study.db"
fi
if [ "$STAGE" = compare ] || [ "$STAGE" = all ]; then
  python3 benchmarks/h200/side_by_side.py "${COMMON[@]}" --study $STUDY --studies-dir $STUDIES \
    --gpu-memory-cap $CAP --repeats 3 --pick max-throughput -o "$OUT/side_by_side.json"
  python3 -m tuner.cli export --study $STUDY --studies-dir $STUDIES --pick max-throughput -o "$OUT/best.env"
  python3 -m tuner.cli inspect --study $STUDY --studies-dir $STUDIES --format json --report "$OUT/report.html" > "$OUT/inspect.json"
  cp $STUDIES/$STUDY/study.db "$OUT/study.db"
fi
