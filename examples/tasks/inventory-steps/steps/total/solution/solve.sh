#!/bin/bash
set -euo pipefail
cd /app/incoming
total=0
while read -r name; do
  total=$((total + $(stat -c %s "$name")))
done < /app/manifest.txt
echo "$total" > /app/total.txt
