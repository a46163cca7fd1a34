#!/bin/bash
set -euo pipefail
/app/bin/issue-token
python3 -c 'import sys; print(open("/app/state/token").read().strip()[::-1], end="")' > /app/answer.txt
