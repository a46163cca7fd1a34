#!/usr/bin/env bash
# The README's commands, as written, on a fresh machine of our CI's kind, simulated on one:
#   - pyenv's Pythons as the machine has them, less uv (an overlay over $PYENV_ROOT, in a
#     private mount namespace, with uv removed from every version);
#   - an empty HOME: no uv or pip cache, so every package is downloaded and llama-cpp-python is
#     compiled;
#   - no Docker daemon, image or vLLM venv from an earlier run: empty folders are mounted over
#     the places .ci/system keeps them (/var/lib/rollwire: the daemon's data root and its
#     images; /run/rollwire-docker: its socket; /opt/rollwire: the vLLM venv), so .ci/system
#     starts a daemon of this run's own, builds debian:bookworm-slim and the vLLM venv from
#     nothing; that daemon is stopped when the run ends;
#   - a fresh clone of REPO (default: this checkout's committed HEAD).
# Debian's packages (chromium, bubblewrap, docker.io) are the host's: installed ones stay.
# Each line of the README's commands block (between its `commands` snippet markers) runs in
# order with its exit status, seconds and the size of the virtual environment after it; the first
# failure stops the run.
# Usage (root): bash scripts/fresh_machine.sh [REPO] > transcript.log 2>&1
# FRESH_LINES=N runs the first N lines only (2: uv and the demo, without the test line).
set -euo pipefail
REPO=$(readlink -f "${1:-$(dirname "$0")/..}")
BASE=${FRESH_BASE:-/tmp/rollwire-fresh}
PYENV_ROOT=${PYENV_ROOT:-$(pyenv root)}
rm -rf "$BASE"
mkdir -p "$BASE/upper" "$BASE/work" "$BASE/home" "$BASE/var-lib-rollwire" \
  "$BASE/run-rollwire-docker" "$BASE/opt-rollwire"
mkdir -p /var/lib/rollwire /run/rollwire-docker /opt/rollwire   # the mount points
exec unshare -m --propagation private bash -s "$BASE" "$REPO" "$PYENV_ROOT" "${FRESH_LINES:-1000}" <<'INNER'
set -euo pipefail
BASE=$1 REPO=$2 PYENV_ROOT=$3 FRESH_LINES=$4
mount -t overlay overlay -o "lowerdir=$PYENV_ROOT,upperdir=$BASE/upper,workdir=$BASE/work" "$PYENV_ROOT"
mount --bind "$BASE/var-lib-rollwire" /var/lib/rollwire
mount --bind "$BASE/run-rollwire-docker" /run/rollwire-docker
mount --bind "$BASE/opt-rollwire" /opt/rollwire
# this run's own Docker daemon (started by .ci/system) ends with it
stop_dockerd() {
  if [ -f /run/rollwire-docker/docker.pid ]; then
    kill "$(cat /run/rollwire-docker/docker.pid)" 2>/dev/null || true
    for _ in $(seq 1 40); do [ -f /run/rollwire-docker/docker.pid ] || break; sleep 0.5; done
  fi
}
trap stop_dockerd EXIT
for v in "$PYENV_ROOT"/versions/*; do
  rm -rf "$v"/bin/uv "$v"/bin/uvx "$v"/lib/python*/site-packages/uv "$v"/lib/python*/site-packages/uv-*.dist-info
done
pyenv rehash
export HOME=$BASE/home
unset UV_PYTHON_DOWNLOADS UV_PYTHON VIRTUAL_ENV UV_CACHE_DIR XDG_CACHE_HOME DOCKER_HOST
cd "$HOME"
git clone -q "$REPO" rollwire
cd rollwire
echo "fresh machine: commit $(git rev-parse --short HEAD); uv on PATH: $(command -v uv || echo none);" \
  "python3: $(python3 --version 2>&1); pip: $(pip --version | cut -d' ' -f1-2)"
echo "fresh machine: uv cache: $( [ -e "$HOME/.cache/uv" ] && echo present || echo none );" \
  "Docker data root: $(ls -A /var/lib/rollwire | wc -l) entries; /opt/rollwire: $(ls -A /opt/rollwire | wc -l) entries;" \
  "daemon socket: $( [ -S /run/rollwire-docker/docker.sock ] && echo present || echo none )"
beyond=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|amx)' | sort -u | tr '\n' ' ' || true)
echo "fresh machine: CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "its flags beyond AVX2: ${beyond:-none}"
sed -n '/\[start:commands\]/,/\[end:commands\]/p' README.md | sed '/^<!--/d;/^```/d' \
  | head -n "${FRESH_LINES:-1000}" > "$BASE/commands"
while IFS= read -r line; do
  start=$(date +%s)
  echo "\$ $line   [$(date -u +%H:%M:%S) UTC]"
  set +e
  # every line it prints stamped with the seconds since the line began (where the time goes)
  bash -c "$line" </dev/null 2>&1 | while IFS= read -r out; do
    printf '[+%4ds] %s\n' "$(( $(date +%s) - start ))" "$out"
  done
  rc=${PIPESTATUS[0]}
  set -e
  size=$( [ -d .venv ] && du -sm .venv | cut -f1 || echo 0 )
  echo "[exit $rc after $(( $(date +%s) - start )) s; .venv ${size} MiB]"
  [ "$rc" -eq 0 ] || exit "$rc"
done < "$BASE/commands"
INNER
