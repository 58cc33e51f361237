#!/bin/bash
# Issue 18's steady state at full size for one output length: stock, then zipage, on one GPU,
# each behind benchmarks/steady_state.py (SGLang's bench_serving, Poisson arrivals above
# capacity), then merged. About 13 minutes per engine, so it runs in the background: start it
# with setsid in one device call and read DIR/progress in the next ones (the machine stays
# held while calls keep coming; each call has its own $OUT, so copy DIR/*.json there):
#   source benchmarks/device_env.sh && mkdir -p /tmp/ss && setsid nohup bash \
#     benchmarks/steady_pair.sh 8192 /tmp/ss SHA > /tmp/ss/pair.out 2>&1 < /dev/null &
#   then, in back-to-back calls:  bash benchmarks/poll_progress.sh /tmp/ss 570
# Flags after the first three go to both runs and override these. A device session holds the
# machine for at most ~28 minutes, and each engine takes ~2.2 min to start plus the window end
# plus ~20 s to drain and write: the 8k pair of steady-8k-h200.json ran with
# --window-start-s 270 --window-end-s 480 (24 minutes held); for 16k outputs use
# --window-start-s 360 --window-end-s 600 --num-prompts 5000 (25 minutes held for
# steady-16k-h200.json).
set -u
py=${PYTHON:-python3}  # CPU check: PYTHON=.venv/bin/python, plus --tiny and small sizes
len=$1; dir=$2; commit=$3; shift 3
mkdir -p "$dir"
common=(--output-len "$len" --num-prompts 4400 --request-rate 8
        --window-start-s 300 --window-end-s 540
        --attention-backend triton --mem-fraction-static 0.85 --cuda-graph-max-bs-decode 512
        --disable-prefill-cuda-graph --zipage-kv-budget 2048 --zipage-buffer 256
        --commit "$commit" "$@")
for engine in stock zipage; do
  echo "$(date +%s) start $engine" >> "$dir/progress"
  $py benchmarks/steady_state.py --engine "$engine" "${common[@]}" \
    --out "$dir/$engine-$len.json" > "$dir/$engine-$len.out" 2>&1
  echo "$(date +%s) end $engine rc=$?" >> "$dir/progress"
done
$py benchmarks/steady_state.py --merge "$dir/stock-$len.json" "$dir/zipage-$len.json" \
  --out "$dir/steady-$len.json" >> "$dir/progress" 2>&1
echo "$(date +%s) done" >> "$dir/progress"
