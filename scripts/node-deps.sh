#!/usr/bin/env bash
# Installs what tests/integration/test_kinesis_js.py needs, when missing: Debian's `nodejs`
# and `npm` (through scripts/apt-install.sh), then the AWS SDK for JavaScript v3 pinned in
# tests/js/package-lock.json (`npm ci` in tests/js, into tests/js/node_modules, which git
# ignores) when tests/js/node_modules is missing or older than the lock file.
# Quick when all is there (no apt, no npm run). Where apt or npm cannot, it says what is
# missing and exits 0: the JS tests then skip with a message.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
js="$root/tests/js"
need=()
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  . "$root/scripts/apt-install.sh"
  apt_install node-deps "the AWS SDK for JavaScript tests will skip" 0 "${need[@]}"
  hash -r
fi
if ! command -v node >/dev/null 2>&1; then
  echo "node-deps: node is needed (Debian: nodejs npm); the AWS SDK for JavaScript tests will skip" >&2
  exit 0
fi
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 20 ]; then
  echo "node-deps: node $(node --version) is older than 20, which the pinned AWS SDK for JavaScript needs;" \
       "the AWS SDK for JavaScript tests will skip" >&2
  exit 0
fi
. "$root/scripts/npm-ci.sh"
npm_ci node-deps "$js" @aws-sdk/client-kinesis "the AWS SDK for JavaScript tests will skip"
