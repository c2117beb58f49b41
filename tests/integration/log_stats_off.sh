#!/usr/bin/env bash
# Run by server_run.sh with --disable-log-stats --log-stats-interval 0.5: a request, then no stats
# line in the log after several intervals.
set -uo pipefail
curl -sf -H "Authorization: Bearer $TESSERA_API_KEY" -H "Content-Type: application/json" \
  -d '{"model": "qwen3-tiny", "prompt": "hi", "max_tokens": 4}' "$TESSERA_URL/v1/completions" >/dev/null ||
  { echo "FAIL: the request failed"; exit 1; }
sleep 2
if grep -q "Avg prompt throughput" "$TESSERA_LOG"; then echo "FAIL: a stats line despite --disable-log-stats"; exit 1; fi
echo "PASS: no stats line"
