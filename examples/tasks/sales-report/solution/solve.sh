#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
import json
from collections import defaultdict

with open("/app/sales.csv", newline="") as f:
    rows = list(csv.DictReader(f))
by_region = defaultdict(float)
for row in rows:
    by_region[row["region"]] += float(row["amount"])
report = {
    "rows": len(rows),
    "total": round(sum(float(r["amount"]) for r in rows), 2),
    "top_region": max(by_region, key=by_region.get),
}
with open("/app/report.json", "w") as f:
    json.dump(report, f)
PY
