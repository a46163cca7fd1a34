#!/bin/bash
# Reward 1 when the manifest survived and the total is 6 + 12 + 24 = 42 bytes.
if [ -s /app/manifest.txt ] && [ "$(tr -d '[:space:]' < /app/total.txt 2>/dev/null)" = "42" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
