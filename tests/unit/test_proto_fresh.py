"""The generated protobuf code in sms/proto/ matches sms/proto/*.proto (scripts/gen_proto.py --check)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
GEN_PROTO = ROOT / "scripts" / "gen_proto.py"
PROTO_DIR = ROOT / "sms" / "proto"
TIMEOUT_S = 120


def _check(script: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=script.parent)


def test_generated_code_is_fresh():
    done = _check(GEN_PROTO)
    assert done.returncode == 0, f"stale generated code: {done.stdout}{done.stderr}"


def _copy_tree(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(GEN_PROTO, tmp_path / "scripts" / "gen_proto.py")
    proto_dir = tmp_path / "sms" / "proto"
    proto_dir.mkdir(parents=True)
    for path in PROTO_DIR.iterdir():
        if path.suffix in (".proto", ".py"):
            shutil.copy2(path, proto_dir / path.name)
    return tmp_path


def test_check_passes_on_an_unmodified_copy(tmp_path):
    root = _copy_tree(tmp_path)
    done = _check(root / "scripts" / "gen_proto.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_fails_when_the_proto_changed(tmp_path):
    root = _copy_tree(tmp_path)
    proto = root / "sms" / "proto" / "sms.proto"
    proto.write_text(proto.read_text() + "\nmessage AddedByTheFreshnessTest { int32 x = 1; }\n")
    done = _check(root / "scripts" / "gen_proto.py")
    assert done.returncode == 1
    assert "sms_pb2.py" in done.stdout


def test_check_fails_when_generated_code_is_missing(tmp_path):
    root = _copy_tree(tmp_path)
    (root / "sms" / "proto" / "sms_pb2_grpc.py").unlink()
    done = _check(root / "scripts" / "gen_proto.py")
    assert done.returncode == 1
    assert "sms_pb2_grpc.py" in done.stdout


def test_check_writes_nothing(tmp_path):
    root = _copy_tree(tmp_path)
    proto = root / "sms" / "proto" / "sms.proto"
    proto.write_text(proto.read_text() + "\nmessage AddedByTheFreshnessTest { int32 x = 1; }\n")
    before = {p.name: p.read_bytes() for p in (root / "sms" / "proto").iterdir()}
    _check(root / "scripts" / "gen_proto.py")
    after = {p.name: p.read_bytes() for p in (root / "sms" / "proto").iterdir()}
    assert after == before
