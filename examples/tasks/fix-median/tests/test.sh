#!/bin/bash
# Reward 1 when every stdlib unittest in test_stats.py passes.
if python3 /tests/test_stats.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
