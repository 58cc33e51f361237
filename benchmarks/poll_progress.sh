#!/bin/bash
# Follow a background chain (benchmarks/steady_pair.sh) from later device calls: wait until
# DIR/progress has a line with MARKER (default "done") or SECONDS pass, print the progress,
# each log's last lines (bench_serving's too), and copy DIR's JSON files and bench_serving
# logs to $OUT (each call has its own $OUT).
#   bash benchmarks/poll_progress.sh /tmp/chain 570
set -u
dir=$1; end=$(( $(date +%s) + $2 )); marker=${3:-done}
while [ "$(date +%s)" -lt "$end" ]; do
  grep -q "$marker" "$dir/progress" 2>/dev/null && break
  sleep 5
done
cat "$dir/progress" 2>/dev/null
for f in "$dir"/*.out; do [ -e "$f" ] && { echo "== $f"; tail -3 "$f"; }; done
for f in "$dir"/*-bench_serving.log; do [ -e "$f" ] && { echo "== $f"; tail -3 "$f" | cut -c1-400; }; done
[ -n "${OUT:-}" ] && cp "$dir"/*.json "$dir"/*-bench_serving.log "$OUT"/ 2>/dev/null
true
