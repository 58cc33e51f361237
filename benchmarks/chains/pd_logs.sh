#!/bin/bash
# Device helper for pd_pair.sh: the pair's result files and the last 300 KB of each log into
# $OUT/, and the first PD transfer failure lines of the servers' logs on stdout.
mkdir -p $OUT/logs; cp /tmp/ss/*.json $OUT/ 2>/dev/null
for f in /tmp/ss/*.log /tmp/ss/*.out; do [ -f "$f" ] && tail -c 300000 "$f" > $OUT/logs/$(basename $f); done
grep -h -E "Lost connection|Session .* failed|Failed to send|handshake failed|transfer failed|Attempting to reconnect" /tmp/ss/*.log 2>/dev/null | head -20
