#!/bin/bash
# Reward 1 when a token was issued and /app/answer.txt holds it reversed.
python3 - <<'PY'
from pathlib import Path

token_path, answer_path = Path("/app/state/token"), Path("/app/answer.txt")
token = token_path.read_text().strip() if token_path.is_file() else ""
answer = answer_path.read_text().strip() if answer_path.is_file() else None
ok = len(token) == 24 and answer == token[::-1]
Path("/logs/verifier/reward.txt").write_text("1" if ok else "0")
print("pass" if ok else f"fail: token={token!r} answer={answer!r}")
PY
