#!/bin/bash
# Reward 1 when the manifest lists the three .dat files, sorted.
if [ "$(cat /app/manifest.txt 2>/dev/null)" = "$(printf 'a.dat\nb.dat\nc.dat')" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
