#!/usr/bin/env bash
# Installs the peers the benchmarks measure side by side, when missing: Debian's
# redis-server and nats-server; Debian's nodejs and npm, then kinesalite (the npm Kinesis
# emulator of bench/kinesis.py) pinned in bench/js/package-lock.json (`npm ci` in
# bench/js, into bench/js/node_modules, which git ignores) when bench/js/node_modules is
# missing or older than the lock file. Needs root (or sudo) and apt-get; elsewhere it
# says what to install and goes on, and the bench skips those peers with a message.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# the packages' own services are not wanted: the bench starts its servers on free ports
. "$root/scripts/apt-install.sh"
apt_install bench-deps "the bench skips them" 0 "${need[@]}"
hash -r

. "$root/scripts/npm-ci.sh"
# (--omit=optional: leveldown, a native module kinesalite needs only for a store on disk)
npm_ci bench-deps "$root/bench/js" kinesalite "the bench skips kinesalite" --omit=optional
