#!/bin/bash
# Steady state at full size for one output length: each run of $RUNS (default "stock zipage";
# zipage-minN adds --zipage-min-kv-budget N, zipage-prompt --zipage-compress-prompt,
# zipage-prompt-minN both) in turn on one GPU through benchmarks/steady_state.py (SGLang's
# bench_serving, Poisson arrivals above capacity, flashinfer for both unless the flags name a
# backend), then each zipage run merged with stock's into DIR/steady[TAG]-LEN.json
# (--long-run windows from stock's turnover; each run's own window with --warm-start).
# Decode graphs: stock --cuda-graph-max-bs-decode 512, zipage its launcher's default.
#
#   bash benchmarks/steady_pair.sh LEN DIR COMMIT [steady_state.py flags...]
#
# Flags after the first three go to every run and override the defaults below; files are
# DIR/RUN-LEN.json, progress lines in DIR/progress. A pair outlives one device call, so start
# it in the background and follow it from the next calls:
#   ZIPAGE_COMMIT=SHA source benchmarks/device_env.sh && mkdir -p /tmp/ss && setsid nohup \
#     bash benchmarks/steady_pair.sh 8192 /tmp/ss SHA > /tmp/ss/pair.out 2>&1 < /dev/null &
#   then, in back-to-back calls:  bash benchmarks/poll_progress.sh /tmp/ss 570
# The 8k warm-start pair of the README:
#   RUNS="stock zipage-prompt-min1024" bash benchmarks/steady_pair.sh 8192 /tmp/ss SHA \
#     --range-ratio 0.5 --warm-start auto --window-start-s 90 --window-end-s 360 --num-prompts 3500
# GPUS="0 1 2" runs the RUNS at once, one GPU each. CPU check: PYTHON=.venv/bin/python plus
# --tiny and small sizes. Every row's exact calls, the windows that fit a device session and
# the history of the runs: docs/benchmarks.md and docs/results.md.
set -u
py=${PYTHON:-python3}  # CPU check: PYTHON=.venv/bin/python, plus --tiny and small sizes
len=$1; dir=$2; commit=$3; shift 3
mkdir -p "$dir"
common=(--output-len "$len" --num-prompts 8000 --request-rate 8
        --window-start-s 300 --window-end-s 600
        --mem-fraction-static 0.85
        --disable-prefill-cuda-graph --zipage-kv-budget 2048 --zipage-buffer 256
        --attention-backend flashinfer --commit "$commit" "$@")
one() {  # one run: stock, zipage, zipage-minN (--zipage-min-kv-budget N), zipage-prompt
  # (--zipage-compress-prompt), or zipage-prompt-minN (both)
  local name=$1 flags=(--engine "${1%%-*}")
  # decode graphs: stock up to 512 (SGLang's own H200 default is 256), zipage its launcher's
  # default (server_args.graph_max_bs: 512 at one budget, 1024 at budget 2048 over floor 1024)
  [[ $name == stock ]] && flags+=(--cuda-graph-max-bs-decode 512)
  [[ $name == *-min* ]] && flags+=(--zipage-min-kv-budget "${name##*-min}")
  [[ $name == *-prompt* ]] && flags+=(--zipage-compress-prompt)
  echo "$(date +%s) start $name" >> "$dir/progress"
  $py benchmarks/steady_state.py "${flags[@]}" "${common[@]}" \
    --out "$dir/$name-$len.json" > "$dir/$name-$len.out" 2>&1
  echo "$(date +%s) end $name rc=$?" >> "$dir/progress"
}
if [ -n "${GPUS:-}" ]; then  # one run per GPU, all at once
  gpus=($GPUS); k=0
  for name in ${RUNS:-stock zipage}; do
    CUDA_VISIBLE_DEVICES=${gpus[$k]} one "$name" & k=$((k + 1))
  done
  wait
else
  for name in ${RUNS:-stock zipage}; do one "$name"; done
fi
for z in "$dir"/zipage*-"$len".json; do
  [ -e "$dir/stock-$len.json" ] && [ -e "$z" ] || continue
  tag=$(basename "$z" "-$len.json"); tag=${tag#zipage}
  # the long-run windows, or (stock never turned over; a warm start, whose aged requests
  # end early, so its turnover says nothing) each run's own
  [[ " $* " != *" --warm-start "* ]] &&
  $py benchmarks/steady_state.py --merge "$dir/stock-$len.json" "$z" --long-run \
    --out "$dir/steady$tag-$len.json" >> "$dir/progress" 2>&1 ||
    $py benchmarks/steady_state.py --merge "$dir/stock-$len.json" "$z" \
      --out "$dir/steady$tag-$len.json" >> "$dir/progress" 2>&1
done
echo "$(date +%s) done" >> "$dir/progress"
