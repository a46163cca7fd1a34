#!/bin/bash
# Reward 1 when exactly the .txt files moved, unchanged, and the others stayed.
python3 - <<'PY'
from pathlib import Path

expected_moved = {
    "report.txt": "quarterly numbers\n",
    "todo.txt": "buy milk\nbuy eggs\n",
    "readme.txt": "hello from the archive task\n",
}
expected_kept = {"service.log", "data.csv"}
archive, inbox = Path("/app/archive"), Path("/app/inbox")
ok = (
    archive.is_dir()
    and {p.name for p in archive.iterdir()} == set(expected_moved)
    and all((archive / n).read_text() == c for n, c in expected_moved.items())
    and {p.name for p in inbox.iterdir()} == expected_kept
)
Path("/logs/verifier/reward.txt").write_text("1" if ok else "0")
print("pass" if ok else "fail")
PY
