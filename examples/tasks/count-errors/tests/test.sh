#!/bin/bash
# Reward 1 when /app/error_count.txt holds the number of ERROR lines (7).
if [ "$(tr -d '[:space:]' < /app/error_count.txt 2>/dev/null)" = "7" ]; then
  echo 1 > /logs/verifier/reward.txt
  echo pass
else
  echo 0 > /logs/verifier/reward.txt
  echo "fail: got '$(cat /app/error_count.txt 2>/dev/null)'"
fi
