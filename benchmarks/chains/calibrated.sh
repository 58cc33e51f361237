#!/bin/bash
# Device chain for issue 46 (the calibrated scorer) on one GPU, in the background; two parts,
# one device session each. Run from the repository root on the device (it copies the tree):
#   cov   the calibrated coverage rows of Qwen3-8B (flashinfer), gpt-oss-20b and Gemma 3 1B
#         (triton), beside a calibration of the 36-layer Qwen3-8B shape when .devstats/ lacks
#         it (bring /tmp/f46/qwen3-8b-dummy-stats.safetensors back into .devstats/)
#   pair  the long-run steady pair at budget B with those statistics (calibrated first, 276 s
#         on an H100, when .devstats/ lacks them)
#   A run("mkdir -p /tmp/wheels && cp .devbundle-big/*.whl /tmp/wheels/", carry=[".devbundle-big"])
#   B run("bash benchmarks/chains/calibrated.sh SHA cov|pair 1792; bash /tmp/zrepo/benchmarks/poll_progress.sh /tmp/f46 540 MARK",
#         carry=[".devbundle", ".devstats"])   (MARK: 'end coverage' / 'end stock'; mkdir .devstats first)
#   then: run("bash /tmp/zrepo/benchmarks/poll_progress.sh /tmp/f46 570 all-done; cp /tmp/f46/*.json /tmp/f46/*.safetensors $OUT/")
set -x
mkdir -p /tmp/f46
rm -rf /tmp/zrepo && cp -r . /tmp/zrepo && cd /tmp/zrepo
export ZIPAGE_COMMIT=$1
source benchmarks/device_env.sh
M=/tmp/zrepo/benchmarks/models/qwen3-8b-dummy
S=/tmp/zrepo/.devstats/qwen3-8b-dummy-stats.safetensors
CAL="python3 -m sglang_zipage.calibrate --model-path $M --load-format dummy --attention-backend flashinfer --sampling-backend pytorch --grammar-backend none --out"  # + the file
cat > /tmp/chain46-inner.sh <<INNER
cd /tmp/zrepo
if [ "$2" = cov ]; then
  if [ ! -f $S ]; then  # beside the coverage rows (small pools; the GPU holds both)
    (echo "\$(date +%s) start calibrate" >> /tmp/f46/progress
     cd /tmp && $CAL /tmp/f46/qwen3-8b-dummy-stats.safetensors > /tmp/f46/calibrate.out 2>&1
     echo "\$(date +%s) end calibrate rc=\$?" >> /tmp/f46/progress) &
  fi
  echo "\$(date +%s) start coverage" >> /tmp/f46/progress
  timeout 440 python3 benchmarks/coverage.py --scorer calibrated --families qwen3-8b,gemma-3-1b,gpt-oss-20b --rows qwen3-8b:bfloat16:flashinfer:1,gpt-oss-20b:bfloat16:triton:1,gemma-3-1b:bfloat16:triton:1 --parallel 3 --gpu-gib 45 --deadline-s 400 --out /tmp/f46/cov-cal.json > /tmp/f46/cov.out 2>&1
  echo "\$(date +%s) end coverage rc=\$?" >> /tmp/f46/progress
  wait
else
  if [ ! -f $S ]; then  # (a fresh checkout: .devstats lost; 276 s on an H100)
    (cd /tmp && $CAL $S > /tmp/f46/calibrate.out 2>&1)
    echo "\$(date +%s) end calibrate rc=\$?" >> /tmp/f46/progress
  fi
  cp $S $M/zipage_query_stats.safetensors
  RUNS="stock zipage-prompt-min1024" bash benchmarks/steady_pair.sh 8192 /tmp/f46 $1 --range-ratio 0.5 --warm-start auto --window-start-s 90 --window-end-s 240 --num-prompts 3500 --zipage-kv-budget $3 > /tmp/f46/pair.out 2>&1
fi
echo "\$(date +%s) all-done" >> /tmp/f46/progress
INNER
setsid nohup bash /tmp/chain46-inner.sh > /tmp/f46/chain.out 2>&1 < /dev/null &
sleep 3; cat /tmp/f46/progress; nvidia-smi --query-gpu=name,memory.total --format=csv
