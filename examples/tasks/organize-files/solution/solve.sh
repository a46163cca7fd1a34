#!/bin/bash
set -euo pipefail
mkdir -p /app/archive
mv /app/inbox/*.txt /app/archive/
