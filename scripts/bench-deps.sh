#!/usr/bin/env bash
# Installs the peers the benchmarks measure side by side, when missing: Debian's
# redis-server and nats-server. Needs root (or sudo) and apt-get; elsewhere it says
# what to install and goes on, and the bench skips those peers with a message.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
# the packages' own services are not wanted: the bench starts its servers on free ports
. "$(dirname "$0")/apt-install.sh"
apt_install bench-deps "the bench skips them" 0 "${need[@]}"
