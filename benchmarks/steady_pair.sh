#!/bin/bash
# Steady state at full size for one output length: each run of $RUNS (default "stock
# zipage"; zipage-minN adds --zipage-min-kv-budget N, zipage-prompt --zipage-compress-prompt,
# zipage-prompt-minN both) in turn on one GPU, behind
# benchmarks/steady_state.py (SGLang's bench_serving, Poisson arrivals above capacity,
# flashinfer for both unless the flags name a backend: zipage's launcher default, while stock
# SGLang picks fa3 on Hopper, which the device's bundle lacks), then merged. It runs
# in the background: start it with setsid in one device call and read DIR/progress in the
# next ones (the machine stays held while calls keep coming; each call has its own $OUT, so
# the polls copy DIR/*.json there):
#   ZIPAGE_COMMIT=SHA source benchmarks/device_env.sh && mkdir -p /tmp/ss && setsid nohup \
#     bash benchmarks/steady_pair.sh 8192 /tmp/ss SHA > /tmp/ss/pair.out 2>&1 < /dev/null &
#   then, in back-to-back calls:  bash benchmarks/poll_progress.sh /tmp/ss 570
# Flags after the first three go to every run and override these; files are DIR/RUN-LEN.json
# and each zipage run merges with stock's into DIR/steady[-minN]-LEN.json.
#
# Arrivals stop at the window end; 8000 prompts at 8/s last 1000 s. Requests sample at
# temperature 1 (steady_state.py --temperature: greedy dummy-weight outputs loop, and the
# loop guard would hold every request at 4x its budget).
# What fits: a device session holds the machine for at most ~28 minutes; an engine takes
# ~3 min to start on a fresh machine (flashinfer's JIT; ~2.2 min after), plus the window end,
# plus ~20 s to drain. A row is "long-run" (merge.turnover_s) when its window starts after
# stock's first running set has finished. With one output length both engines move in waves
# (requests admitted together finish together: stock turns over at the second wave's end,
# ~10 min in at 8k). Output lengths spread over [r x LEN, LEN] (--range-ratio r < 1,
# bench_serving's own default is 0) stagger the finishes, and the running set turns over
# within about one longest lifetime (8k at ~33 ms a step: ~4.5 min, plus the fill). So the
# rows run one or two engines per session, each to the same window end, and the merge puts
# both windows at [stock's turnover, window end] (--long-run, the rule fixed before the runs):
#   RUNS="stock zipage" bash benchmarks/steady_pair.sh 8192 /tmp/ss SHA --range-ratio 0.5
#   RUNS=zipage-min1024 bash ... (next session; zipage-minN adds --zipage-min-kv-budget N)
#   steady_state.py --merge stock-8192.json zipage-8192.json --long-run --out steady-8k.json
# (a merged file can stand for its stock run: --merge results/steady-8k-r05-long-run-h200.json
# zipage-min1024-8192.json, the later zipage run replacing the merged one's).
# Measured at 8k (results/steady-8k-r05-long-run-h200.json): stock turned over at 392 s, 1.37x
# its longest lifetime. At 16k that predicts ~800 s, so one engine per session,
#   RUNS=stock bash benchmarks/steady_pair.sh 16384 /tmp/ss SHA --range-ratio 0.5 \
#     --window-end-s 1300 --num-prompts 11000
# (~5 min to start on a fresh machine + 1300 s + the drain: ~27.5 minutes held), then zipage,
# then zipage-min1024, in later sessions with the same flags, merged as above.
# A warm start (--warm-start auto, sglang_zipage/harness/warm_start.py) skips the wait for
# the turnover: each engine's load begins with as many requests as its pool holds in a long
# run, drawn as a long run's running set (remaining lengths; for stock the ages as prompt
# tokens), so both engines of a 16k pair fit one session:
#   RUNS="stock zipage" bash benchmarks/steady_pair.sh 16384 /tmp/ss SHA --range-ratio 0.5 \
#     --warm-start auto --window-start-s 150 --window-end-s 480 --num-prompts 4500
# (~2 x (2.5 min to start + 480 s + the drain) + the machine's start: ~25 minutes held),
# merged without --long-run (each run's own window; its row says "span": "warm-start"). Done
# at 95fe77d (results/steady-16k-r05-warm-h200.json: 25 minutes held; stock's first start took
# 307 s on the fresh machine, zipage's 68 s after it); zipage runs of a later session with
# the same flags merge beside its stock run (RUNS="zipage-min1024 zipage-prompt-min1024" ...
# --cuda-graph-max-bs-decode 768: the arithmetic runs 470 and 617 requests; done at d02de71,
# results/steady-16k-r05-warm-{min1024,prompt-min1024}-h200.json: 3.51x and 4.15x). Its
# check against a long run: RUNS=stock at 8192 with the same flags, beside the stock run of
# results/steady-8k-r05-long-run-h200.json (benchmarks/warm_start_check.py).
# The 8k check and the squeezed 8k pair at the floor rule are one session:
#   RUNS="stock zipage-prompt-min1024" bash benchmarks/steady_pair.sh 8192 /tmp/ss SHA \
#     --range-ratio 0.5 --warm-start auto --window-start-s 90 --window-end-s 360 --num-prompts 3500
# (~4 min to start stock on a fresh machine, 360 s, the drain, ~1 min to start zipage, 360 s:
# ~19 minutes, 24.5 held with the machine's start). An H100 try at 1d7a531 lost its machine
# before zipage's run (results/steady-8k-r05-warm-stock-attempt-h100.json); each run records
# its card ("gpu") and a merge refuses runs of two kinds of card. Done at fb408e7 on an H200:
# results/warm-start-8k-h200.json (the warm stock run reads 7.5% under the cold long run's
# late span) and results/steady-8k-r05-warm-prompt-min1024-h200.json (1.52x: zipage ran 657
# requests, past the 512 decode graphs both engines then had, so its decode ran eagerly; the
# launcher now sizes zipage's graphs from the budget range, server_args.graph_max_bs, and
# this script gives only stock an explicit 512). Then both zipage runs in one session, 16k
# first (its goal, 4.2x, was the one in reach), each beside its committed stock run:
#   ( bash benchmarks/steady_pair.sh 16384 /tmp/s16 SHA --range-ratio 0.5 --warm-start auto \
#       --window-start-s 150 --window-end-s 480 --num-prompts 4500
#     bash benchmarks/steady_pair.sh 8192 /tmp/s8 SHA --range-ratio 0.5 --warm-start auto \
#       --window-start-s 90 --window-end-s 360 --num-prompts 3500 )   with RUNS=zipage-prompt-min1024
# (~5 min to start on a fresh machine + 480 s + the drain, then ~1 min + 360 s: ~21 minutes,
# ~26 held with the machine's start; the 8k run is the one a short session loses). Merged here:
#   steady_state.py --merge results/steady-16k-r05-warm-h200.json zipage-prompt-min1024-16384.json
#     --spans 0-480,150-480,60-480 (on an H200: that stock run does not record its card, so the
#     merge cannot check it; read the reply's device): A1c predicts ~628 running, 4.3x;
#   steady_state.py --merge results/steady-8k-r05-warm-prompt-min1024-h200.json
#     zipage-prompt-min1024-8192.json --spans 0-360,90-360,180-360: the step line gives ~46 ms
#     at 657 running, ~2.2x stock's long run.
# Done at 35bb741 (one H200 session, 21 minutes held after the wheel call):
# results/steady-16k-r05-warm-prompt-min1024-a1c-h200.json (645 running, 4.23x) and
# results/steady-8k-r05-warm-prompt-min1024-graphs-h200.json (658 running, a step 49 ms, 2.24x
# its warm stock run, 2.07x the cold long run's).
# On a multi-GPU kind, GPUS="0 1 2" runs the RUNS at once, one GPU each (their own pools and
# steps, as on one GPU; the client processes share the host's cores).
# The first-wave pairs of results/steady-{8k,16k}-h200.json ran both engines in one session
# on triton at one output length: --attention-backend triton --window-start-s 270
# --window-end-s 480 (8k, 24 minutes held) and --window-start-s 360 --window-end-s 600
# --num-prompts 5000 (16k, 25).
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
