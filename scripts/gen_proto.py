#!/usr/bin/env python3
"""Regenerate sms/proto/*_pb2*.py from sms/proto/*.proto.

Run from anywhere: `python scripts/gen_proto.py`. With `--check` it writes nothing and
exits 1 when the committed code differs from what the .proto files generate (the test
tests/unit/test_proto_fresh.py runs that).
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

from grpc_tools import protoc
import grpc_tools

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "sms" / "proto"


def generate(out_dir: pathlib.Path) -> None:
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        rc = protoc.main(["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_dir}",
                          f"--grpc_python_out={out_dir}", str(proto.relative_to(ROOT))])
        if rc != 0:
            raise SystemExit(f"protoc failed on {proto}")


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        generate(out)
        stale = []
        for fresh in sorted((out / "sms" / "proto").glob("*.py")):
            target = PROTO_DIR / fresh.name
            if check:
                if not target.exists() or target.read_bytes() != fresh.read_bytes():
                    stale.append(fresh.name)
            else:
                target.write_bytes(fresh.read_bytes())
    if stale:
        print("stale generated code: " + ", ".join(stale) + " (run scripts/gen_proto.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
