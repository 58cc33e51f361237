#!/bin/bash
# Device chain for issue 47: the PD steady pair as a long run on one GPU (stock PD against
# zipage PD, the decode server compressed; Qwen3-8B shape, 8k outputs range 0.5, window
# 200-360 s), in the background so the device calls can poll it; logs kept (pd_logs.sh).
# Run from the repository root on the device (it copies the tree to /tmp/zrepo):
#   A run("mkdir -p /tmp/wheels && cp .devbundle-big/*.whl /tmp/wheels/", carry=[".devbundle-big"])
#   B run("bash benchmarks/chains/pd_pair.sh SHA; bash /tmp/zrepo/benchmarks/poll_progress.sh /tmp/ss 540 'end stock'; bash /tmp/zrepo/benchmarks/chains/pd_logs.sh",
#         carry=[".devbundle", ".devbundle-pd"])   (SHA: git rev-parse --short HEAD)
#   then: run("bash /tmp/zrepo/benchmarks/poll_progress.sh /tmp/ss 570 all-done; bash /tmp/zrepo/benchmarks/chains/pd_logs.sh")
# Bundles: bash ../shared/device/build.sh, the sglang-kernel and flashinfer wheels moved to
# .devbundle-big/ (the carry limit), and bash benchmarks/pd_bundle.sh build.
set -x
rm -rf /tmp/zrepo && cp -r . /tmp/zrepo && cd /tmp/zrepo
export ZIPAGE_COMMIT=$1
source benchmarks/device_env.sh
source benchmarks/pd_bundle.sh install; echo "pd bundle rc=$?"
mkdir -p /tmp/stubs/deep_gemm && touch /tmp/stubs/deep_gemm/__init__.py
export PYTHONPATH=$PYTHONPATH:/tmp/stubs SGLANG_ENABLE_JIT_DEEPGEMM=0
mkdir -p /tmp/ss
cat > /tmp/chain-inner.sh <<INNER
cd /tmp/zrepo && RUNS="stock zipage-prompt-min1024" bash benchmarks/steady_pair.sh 8192 /tmp/ss $1 --pd --mem-fraction-static 0.75 --range-ratio 0.5 --window-start-s 200 --window-end-s 360 --num-prompts 4000 > /tmp/ss/pair.out 2>&1
echo "\$(date +%s) all-done" >> /tmp/ss/progress
INNER
setsid nohup bash /tmp/chain-inner.sh > /tmp/ss/chain.out 2>&1 < /dev/null &
sleep 3; cat /tmp/ss/progress; nvidia-smi --query-gpu=name,memory.total --format=csv
