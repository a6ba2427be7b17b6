#!/usr/bin/env bash
# The install without a compiler: builds the package's wheel with the C compiler replaced
# by `false`, checks that the build went on without the compiled wire codec (and said so),
# and that the package from that wheel imports and runs on the pure-Python reference.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# a copy of the source without build products (build/, in-place .so files)
mkdir "$work/src" && git ls-files -co --exclude-standard | grep -v '^\.venv/' | tar -cf - -T - | tar -xf - -C "$work/src"
CC=false LDSHARED=false .venv/bin/python -m pip wheel -q --no-deps --disable-pip-version-check -w "$work/wheel" \
  "$work/src" \
  > "$work/build.log" 2>&1 || { cat "$work/build.log" >&2; echo "check-no-compiler: the build failed" >&2; exit 1; }
wheel="$(ls "$work"/wheel/*.whl)"
if unzip -l "$wheel" | grep -q '_wire.*\.so'; then
  echo "check-no-compiler: the wheel holds a compiled codec although no compiler ran" >&2; exit 1
fi
mkdir "$work/site" && (cd "$work/site" && unzip -q "$wheel")
# -S: not the .venv's editable install of this checkout; its packages come after the wheel's
site_packages="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
(cd "$work" && PYTHONPATH="$work/site:$site_packages" "$root/.venv/bin/python" -S -) <<'PY'
import sms.wire as wire
assert wire.IMPLEMENTATION == "python" and wire.compiled is None, wire.IMPLEMENTATION
assert wire.__file__.startswith(__import__("os").environ["PYTHONPATH"].split(":")[0]), wire.__file__
entries = [wire.encode_session_entry(b"k", b"data", 0, 1_700_000_000_000)]
parsed = wire.parse_put(1, b"".join(entries), b"producer")
assert parsed[0].key == b"k" and parsed[0].data == b"data"
print("check-no-compiler: the wheel built without a compiler runs on the pure-Python reference")
PY
