#!/usr/bin/env bash
# The full fidelity set (run_fidelity.py --preset full) on a machine with two GPUs, one command:
#   bash benchmarks/fidelity/run_h200.sh OUT_DIR [WORKDIR]
# GPU 0 runs the 19 engine configurations, $PARALLEL (7) at a time; GPU 1 runs the HF reference
# at the same time, one process per budget (the 25% one adds the bf16 numerics yardstick). A
# last run_fidelity.py call reads every part file (--resume) and writes OUT_DIR/fidelity.json,
# fidelity_raw.json.gz and fidelity.png. Part files stay in WORKDIR (default
# /tmp/fidelity-full): run it again and it resumes where it stopped.
# Environment: ENGINE_GPU / HF_GPU (0 / 1; the same GPU works, slower), HF_DEVICE (cuda),
# PARALLEL, ENGINE_ARGS (the engine's GPU settings below), FIDELITY_ARGS (extra
# run_fidelity.py arguments, e.g. a small set for a smoke run), BUDGETS ("0.1875 0.25": other
# budget fractions than the full preset's), PYTHON.
set -u
out=${1:?usage: run_h200.sh OUT_DIR [WORKDIR]}
wd=${2:-/tmp/fidelity-full}
py=${PYTHON:-python3}
fid=benchmarks/fidelity/run_fidelity.py
cmd="bash benchmarks/fidelity/run_h200.sh $*"
for v in FIDELITY_ARGS ENGINE_ARGS PARALLEL BUDGETS; do  # overrides belong to the recorded command
    [ -n "${!v+x}" ] && cmd="$v=$(printf %q "${!v}") $cmd"
done
# triton attention and the pytorch sampler: the GPU machine's SGLang bundle has neither fa3
# (SGLang's Hopper default) nor flashinfer's sampling kernels; 12 texts need graphs up to 16.
engine_args=${ENGINE_ARGS-"--engine-arg attention_backend=triton --engine-arg sampling_backend=pytorch --engine-arg grammar_backend=none --engine-arg cuda_graph_max_bs_decode=16"}
# shellcheck disable=SC2206  # word splitting of the two argument strings is intended
common=(--preset full ${FIDELITY_ARGS:-} --hf-device "${HF_DEVICE:-cuda}" ${engine_args}
        --parallel "${PARALLEL:-7}" --resume)
# the full preset's budgets, or BUDGETS (space separated fractions); one HF process each
budgets=(${BUDGETS:-0.125 0.25 0.5})
[ -n "${BUDGETS:-}" ] && common+=(--budgets "$(IFS=,; echo "${budgets[*]}")")
mkdir -p "$out" "$wd/logs"
log() { echo "[run_h200 $(date +%H:%M:%S)] $*"; }

model=$(cd /tmp && $py -c 'from sglang_zipage.model import bundled_model_path as p; print(p())') \
    || { log "the bundled model could not be converted"; exit 1; }
log "model: $model"

log "engine configurations on GPU ${ENGINE_GPU:-0}; log $wd/logs/engine.log"
CUDA_VISIBLE_DEVICES=${ENGINE_GPU:-0} $py $fid "${common[@]}" --skip-hf --workdir "$wd" \
    --out "$wd/engine-only.json" >"$wd/logs/engine.log" 2>&1 &
pids=($!)
for b in "${budgets[@]}"; do
    noise=none; [ "$b" = 0.25 ] && noise=bfloat16
    log "HF reference at budget $b on GPU ${HF_GPU:-1}; log $wd/logs/hf-$b.log"
    CUDA_VISIBLE_DEVICES=${HF_GPU:-1} $py $fid "${common[@]}" --skip-engine --hf-budgets "$b" \
        --hf-noise-dtype "$noise" --workdir "$wd/hf-$b" --out "$wd/hf-$b/summary.json" \
        >"$wd/logs/hf-$b.log" 2>&1 &
    pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
tail -n 3 "$wd"/logs/*.log
[ "$fail" = 0 ] || { log "a part failed: see $wd/logs"; exit 1; }
for b in "${budgets[@]}"; do cp "$wd/hf-$b"/hf*.json "$wd/"; done

log "merge"
CUDA_VISIBLE_DEVICES=${HF_GPU:-1} $py $fid "${common[@]}" --workdir "$wd" \
    --out "$out/fidelity.json" --raw-out "$out/fidelity_raw.json.gz" --png "$out/fidelity.png" \
    --record-command "$cmd" 2>&1 | tee "$wd/logs/merge.log"
exit "${PIPESTATUS[0]}"
