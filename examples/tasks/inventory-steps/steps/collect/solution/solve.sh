#!/bin/bash
set -euo pipefail
cd /app/incoming
ls -1 *.dat | sort > /app/manifest.txt
