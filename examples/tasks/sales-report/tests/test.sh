#!/bin/bash
# Writes three rewards to reward.json: format (the file is a JSON object with the three keys),
# correct (all three values right) and partial (the fraction of values that are right).
python3 - <<'PY'
import json
from pathlib import Path

expected = {"rows": 8, "total": 928.0, "top_region": "south"}
try:
    report = json.loads(Path("/app/report.json").read_text())
except (OSError, ValueError):
    report = None
well_formed = isinstance(report, dict) and set(report) == set(expected)
right = 0
if isinstance(report, dict):
    right += report.get("rows") == expected["rows"] and not isinstance(report.get("rows"), bool)
    total = report.get("total")
    right += isinstance(total, (int, float)) and abs(total - expected["total"]) < 1e-6
    right += report.get("top_region") == expected["top_region"]
rewards = {
    "format": 1.0 if well_formed else 0.0,
    "correct": 1.0 if well_formed and right == 3 else 0.0,
    "partial": round(right / 3, 4),
}
Path("/logs/verifier/reward.json").write_text(json.dumps(rewards))
print(rewards)
PY
