#!/usr/bin/env bash
# Installs what the project needs into ./.venv, once per change of pyproject.toml.
# Usage: scripts/bootstrap.sh [EXTRAS]   e.g. scripts/bootstrap.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"

if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "bootstrap: Python >= 3.11 is required (found: $("$py" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$py" -m venv .venv 2>/dev/null; then
    # Debian splits venv out of the interpreter package
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      rm -rf .venv && "$py" -m venv .venv
    else
      echo "bootstrap: '$py -m venv' failed; install your distribution's venv package" >&2
      exit 1
    fi
  fi
fi
# (the compiled wire codec is part of the install: a change to its source reinstalls too)
stamp=".venv/.installed-$(cat pyproject.toml setup.py sms/_wire.c | sha1sum | cut -c1-12)-${extras:-base}"
if [ ! -f "$stamp" ]; then
  echo "bootstrap: installing into .venv (${extras:-base}) ..." >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' >&2 || true
  spec="."; [ -n "$extras" ] && spec=".[$extras]"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  .venv/bin/python -c 'import grpc, lmdb, xxhash, node.cli' || { echo "bootstrap: install failed" >&2; exit 1; }
  .venv/bin/python -c 'import sms.wire as w; print(f"bootstrap: wire codec: {w.IMPLEMENTATION}")' >&2
  rm -f .venv/.installed-*-"${extras:-base}"
  touch "$stamp"
fi
