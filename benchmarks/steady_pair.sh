#!/bin/bash
# Steady state at full size for one output length: each engine of $ENGINES (default "stock
# zipage") in turn on one GPU, behind benchmarks/steady_state.py (SGLang's bench_serving,
# Poisson arrivals above capacity, the launcher's attention backend unless the flags name
# one: flashinfer), then merged when both ran. It runs in the background: start it with
# setsid in one device call and read DIR/progress in the next ones (the machine stays held
# while calls keep coming; each call has its own $OUT, so the polls copy DIR/*.json there):
#   ZIPAGE_COMMIT=SHA source benchmarks/device_env.sh && mkdir -p /tmp/ss && setsid nohup \
#     bash benchmarks/steady_pair.sh 8192 /tmp/ss SHA > /tmp/ss/pair.out 2>&1 < /dev/null &
#   then, in back-to-back calls:  bash benchmarks/poll_progress.sh /tmp/ss 570
# Flags after the first three go to every run and override these; $LABEL (e.g. -min1024 with
# --zipage-min-kv-budget 1024) names the runs' files ENGINE$LABEL-LEN.json.
#
# Arrivals stop at the window end; 8000 prompts at 8/s last 1000 s.
# What fits: a device session holds the machine for at most ~28 minutes, and an engine takes
# ~2.2 min to start (the first flashinfer start on a fresh machine ~3 min more) plus the window
# end plus ~20 s to drain. With one output length both engines move in waves: the running set
# admitted together finishes together, one wave per output length's decode time (8k at ~32
# ms a step on flashinfer: ~4.5 min). A row is "long-run" (merge.turnover_s) when its window
# starts after stock's first running set has finished; at 8k that is the second wave's end,
# ~10 min in, so a long-run window of one more wave ends ~15 min in: one engine per session
# (ENGINES=stock, then ENGINES=zipage, then ENGINES=zipage LABEL=-min1024 ... with
# --window-start-s 600 --window-end-s 900, merged afterwards with steady_state.py --merge).
# Output lengths spread over [r x LEN, LEN] (--range-ratio r < 1, bench_serving's own default
# is 0) stagger the finishes, and the running set turns over within one longest lifetime.
# The first-wave pairs of results/steady-{8k,16k}-h200.json ran both engines in one session
# on triton: --attention-backend triton --window-start-s 270 --window-end-s 480 (8k, 24
# minutes held) and --window-start-s 360 --window-end-s 600 --num-prompts 5000 (16k, 25).
set -u
py=${PYTHON:-python3}  # CPU check: PYTHON=.venv/bin/python, plus --tiny and small sizes
len=$1; dir=$2; commit=$3; shift 3
mkdir -p "$dir"
common=(--output-len "$len" --num-prompts 8000 --request-rate 8
        --window-start-s 300 --window-end-s 540
        --mem-fraction-static 0.85 --cuda-graph-max-bs-decode 512
        --disable-prefill-cuda-graph --zipage-kv-budget 2048 --zipage-buffer 256
        --commit "$commit" "$@")
for engine in ${ENGINES:-stock zipage}; do
  echo "$(date +%s) start $engine${LABEL:-}" >> "$dir/progress"
  $py benchmarks/steady_state.py --engine "$engine" "${common[@]}" \
    --out "$dir/$engine${LABEL:-}-$len.json" > "$dir/$engine${LABEL:-}-$len.out" 2>&1
  echo "$(date +%s) end $engine${LABEL:-} rc=$?" >> "$dir/progress"
done
if [ -e "$dir/stock${LABEL:-}-$len.json" ] && [ -e "$dir/zipage${LABEL:-}-$len.json" ]; then
  $py benchmarks/steady_state.py --merge "$dir/stock${LABEL:-}-$len.json" \
    "$dir/zipage${LABEL:-}-$len.json" --out "$dir/steady${LABEL:-}-$len.json" >> "$dir/progress" 2>&1
fi
echo "$(date +%s) done" >> "$dir/progress"
