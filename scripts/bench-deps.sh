#!/usr/bin/env bash
# Installs the peers the benchmarks measure side by side, when missing: Debian's
# redis-server and nats-server. Needs root (or sudo) and apt-get; elsewhere it says
# what to install and goes on, and the bench skips those peers with a message.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "bench-deps: please install ${need[*]} (no apt-get here); the bench skips them" >&2
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "bench-deps: run as root, or install ${need[*]}; the bench skips them" >&2
    exit 0
  fi
fi
echo "bench-deps: installing ${need[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
# the packages' own services are not wanted: the bench starts its servers on free ports
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
  $sudo apt-get update -qq >/dev/null 2>&1
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || {
    echo "bench-deps: could not install ${need[*]}; the bench skips them" >&2; exit 0; }
}
