#!/bin/bash
set -euo pipefail
grep -c 'ERROR' "$LOG_FILE" > /app/error_count.txt
