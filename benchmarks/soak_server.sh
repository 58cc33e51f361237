#!/usr/bin/env bash
# Soak one sglang_zipage server under SGLang's strict memory checker, then stop it (issue 7).
#
#   bash benchmarks/soak_server.sh OUT.json "SERVER FLAGS" SOAK.PY FLAGS...
#
# The server runs a 2-layer Qwen3 with dummy weights (bench_throughput.tiny_model_dir(),
# token ids, no tokenizer) with the given flags; soak.py drives it; the JSON gets the
# server command and the number of tracebacks in the server log (SGLang's checker raises
# in the scheduler on a leak or a broken page invariant, which /health then reports too).
# The H200 run behind benchmarks/results/soak-h200.json:
#   bash benchmarks/soak_server.sh $OUT/soak-h200.json "--attention-backend triton \
#     --page-size 16 --zipage-mode fixed --zipage-async --zipage-kv-budget 256 --zipage-buffer 64 \
#     --max-total-tokens 32768 --disable-prefill-cuda-graph" \
#     --input-ids --num-requests 10000 --concurrency 256 --seed 0
set -u
out=$1; server_flags=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # absolute: the server runs elsewhere
port=${PORT:-31700}
log=$(realpath -m "${out%.json}-server.log")
model=$("$py" -c "import sys; sys.path.insert(0, '$here')
from bench_throughput import tiny_model_dir; print(tiny_model_dir())")
env_strict="SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1 SGLANG_CHECK_KV_PAGE_INVARIANTS=1 SGLANG_DEBUG_MEMORY_POOL=1"
flags="--load-format dummy --skip-tokenizer-init --sampling-backend pytorch --grammar-backend none $server_flags --port $port"
server_cmd="$env_strict $py -m sglang_zipage.launch_server --model-path <tiny 2-layer Qwen3: bench_throughput.tiny_model_dir()> $flags"
# The server starts in the model's folder, not the repository root: there `python -m` would
# find the root's kernels/ as the top-level `kernels` (PyPI's, which transformers probes for;
# on the device, where the package runs from PYTHONPATH, that stopped the server at import).
# shellcheck disable=SC2086
(cd "$model" && exec env $env_strict "$py" -m sglang_zipage.launch_server --model-path "$model" \
  $flags >"$log" 2>&1) &
pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 $pid 2>/dev/null || { echo "server died, log: $log"; tail -50 "$log"; exit 1; }
  sleep 1
done
echo "server up after ${SECONDS}s"
"$py" "$here/soak.py" --url "http://127.0.0.1:$port" --out "$out" "$@" >/dev/null
rc=$?
kill -TERM $pid; wait $pid 2>/dev/null  # SGLang ends its own tree on SIGTERM
"$py" - "$out" "$log" "$server_cmd" <<'PY'
import json, sys
out, log, cmd = sys.argv[1:]
res = json.load(open(out))
res["server_command"] = cmd
res["server_log_tracebacks"] = open(log, errors="replace").read().count("Traceback")
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: res[k] for k in ("requests", "aborted", "completed", "errors", "leaked_slots",
                                      "healthy", "server_log_tracebacks", "load_s")}))
PY
rm -rf "$model"
exit $rc
