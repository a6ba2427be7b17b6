# Sourced by scripts/node-deps.sh and scripts/bench-deps.sh: the one way they install npm
# packages pinned by a package-lock.json.
#
# npm_ci NAME DIR PACKAGE SKIPS [NPM-FLAG...]
#   Runs `npm ci` in DIR (into DIR/node_modules, which git ignores) when DIR/node_modules
#   lacks PACKAGE or is older than DIR/package-lock.json; quick when all is there. Without
#   node and npm, or when npm fails (the registry out of reach), it says so (NAME: who
#   asks; SKIPS: what then skips), leaves no half install, and returns 0.

npm_ci() {
  local name=$1 dir=$2 package=$3 skips=$4
  shift 4
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "$name: node and npm are needed (Debian: nodejs npm); $skips" >&2
    return 0
  fi
  # npm ci writes node_modules/.package-lock.json last: its age is the install's
  local stamp="$dir/node_modules/.package-lock.json"
  if [ -f "$stamp" ] && [ -d "$dir/node_modules/$package" ] && ! [ "$dir/package-lock.json" -nt "$stamp" ]; then
    return 0
  fi
  echo "$name: npm ci in ${dir#"$PWD"/} ..." >&2
  if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error "$@" >/dev/null); then
    rm -rf "$dir/node_modules"        # (not half an install: what needs it skips rather than fails)
    echo "$name: npm ci failed in $dir (is the npm registry reachable?); $skips" >&2
    return 0
  fi
  touch "$stamp"
}
