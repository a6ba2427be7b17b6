# Sourced by scripts/system-deps.sh, scripts/node-deps.sh and scripts/bench-deps.sh: the one way they install
# Debian packages.
#
# apt_install NAME SKIPS STRICT PACKAGE...
#   Installs the packages with apt-get, as root or through sudo, and updates the package
#   lists once when the first try fails. Without apt-get, or without root and sudo, it
#   says what to install (NAME: who asks; SKIPS: what then skips) and returns 0, so the
#   caller goes on. A failed install fails with STRICT=1; with STRICT=0 it says so and
#   returns 0.
# as_root COMMAND...: runs the command as root (through sudo when not root).

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  local name=$1 skips=$2 strict=$3
  shift 3
  [ $# -eq 0 ] && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: please install $* (no apt-get here); $skips" >&2
    return 0
  fi
  if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null 2>&1; then
    echo "$name: run as root, or install $*; $skips" >&2
    return 0
  fi
  echo "$name: installing $* ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 && return 0
  as_root apt-get update -qq >/dev/null 2>&1 || true
  as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null && return 0
  [ "$strict" = 1 ] && return 1
  echo "$name: could not install $*; $skips" >&2
  return 0
}
