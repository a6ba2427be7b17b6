"""Fragment stores (sms/objectstore.py): one set of behaviour tests run against the file
store and against an S3 store talking to moto's server (a real separate process on
loopback), plus each backend's own failures: a root that is a file, a full filesystem
(a real 1 MiB tmpfs), an endpoint that refuses connections, a missing bucket.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sms.objectstore import FileStore, FragmentStore, S3Store, check_url, open_store
from sms import limits
from sms.errors import ArchiveUnavailable, FragmentMissing, InvalidArgument, InvalidStreamConfig

from tests.motoserver import MotoServer
from tests.zkserver import free_port

REPLACE_READS = 40


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server as its own process, up until the module's tests are done."""
    pytest.importorskip("moto")
    pytest.importorskip("boto3")
    server = MotoServer().start()
    try:
        yield server.endpoint
    finally:
        server.stop()


def _aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, tmp_path: Path) -> None:
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials")}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _new_bucket(endpoint: str) -> str:
    import boto3
    bucket = f"sms-test-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(params=["file", "s3", "s3-no-prefix"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[FragmentStore]:
    if request.param == "file":
        made: FragmentStore = FileStore(f"file://{tmp_path}/archive/")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        _aws_env(monkeypatch, endpoint, tmp_path)
        bucket = _new_bucket(endpoint)
        made = S3Store(f"s3://{bucket}/some/prefix/" if request.param == "s3" else f"s3://{bucket}")
    yield made
    made.close()


# --- behaviour shared by both backends -------------------------------------------------

def test_put_get_replace(store: FragmentStore) -> None:
    big = os.urandom(300_000)
    store.put("s/1/00000/a.zst", big)
    store.put("s/1/00000/empty", b"")
    assert store.get("s/1/00000/a.zst") == big
    assert store.get("s/1/00000/empty") == b""
    store.put("s/1/00000/a.zst", b"second")
    assert store.get("s/1/00000/a.zst") == b"second"


def test_replace_is_atomic(store: FragmentStore) -> None:
    """A reader racing a writer that keeps replacing one name sees whole versions only."""
    versions = [bytes([i]) * 200_000 for i in range(4)]
    store.put("s/1/x", versions[0])
    stop = threading.Event()

    def replace() -> None:
        for i in range(1_000_000):
            if stop.is_set():
                return
            store.put("s/1/x", versions[i % len(versions)])

    writer = threading.Thread(target=replace)
    writer.start()
    try:
        for _ in range(REPLACE_READS):
            assert store.get("s/1/x") in versions
    finally:
        stop.set()
        writer.join()
    assert store.list("s/") == ["s/1/x"]                      # (no temp file listed)


def test_missing(store: FragmentStore) -> None:
    with pytest.raises(FragmentMissing, match="nothing/here"):
        store.get("nothing/here")
    store.put("a/b", b"x")
    with pytest.raises(FragmentMissing):
        store.get("a/c")


def test_list(store: FragmentStore) -> None:
    names = ["s/1/00001/b", "s/1/00001/a", "s/1/00002/a", "s/10/00001/a", "t~s_x/1/0/z",
             ".dotted/1/0/f", "s/1/00001/sub/c"]
    for name in names:
        store.put(name, name.encode())
    assert store.list("s/1/00001/") == ["s/1/00001/a", "s/1/00001/b", "s/1/00001/sub/c"]
    assert store.list("s/1/") == ["s/1/00001/a", "s/1/00001/b", "s/1/00001/sub/c", "s/1/00002/a"]
    assert store.list("s/1") == sorted(n for n in names if n.startswith("s/1"))   # partial segment
    assert store.list("s/1/00001/a") == ["s/1/00001/a"]
    assert store.list("") == sorted(names)
    assert store.list("none/") == [] and store.list("s/2/") == []
    assert store.list("s/1/00001/a/") == []                 # (a file, not a directory)


def test_delete(store: FragmentStore) -> None:
    store.put("s/1/0/a", b"a")
    store.put("s/1/0/b", b"b")
    store.delete("s/1/0/a")
    store.delete("s/1/0/a")                                  # absent: no error
    store.delete("never/was")
    assert store.list("s/") == ["s/1/0/b"]
    with pytest.raises(FragmentMissing):
        store.get("s/1/0/a")


def test_delete_prefix(store: FragmentStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "ARCHIVE_S3_DELETE_BATCH_MAX", 2)   # S3: several batches
    for i in range(5):
        store.put(f"s/1/00001/{i}", b"x")
    store.put("s/1/00002/0", b"y")
    store.put("s/10/00001/0", b"z")
    assert store.delete_prefix("s/1/00001/") == 5
    assert store.list("") == ["s/1/00002/0", "s/10/00001/0"]
    assert store.delete_prefix("s/1/00001/") == 0
    store.put("s/1/00001/again", b"a")                       # (its directory was pruned)
    assert store.get("s/1/00001/again") == b"a"
    assert store.delete_prefix("s/1/") == 2
    assert store.list("") == ["s/10/00001/0"]
    with pytest.raises(InvalidArgument):
        store.delete_prefix("")


BAD_NAMES = ["", "/abs", "a/../b", "..", "../a", "a/./b", ".", "a//b", "a/", "a b", "a\\b",
             "é", "a:b", "a?b", "x" * (limits.ARCHIVE_NAME_CHARS_MAX + 1),
             "d/.f.tmp-0123456789abcdef", None, b"bytes"]


BAD_PREFIXES = ["/a/", "../", "a/../", "a//", "a b/", "./", None]


def test_bad_names_refused(store: FragmentStore) -> None:
    for name in BAD_NAMES:
        with pytest.raises(InvalidArgument):
            store.put(name, b"x")                            # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.get(name)                                  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.delete(name)                               # type: ignore[arg-type]
    for prefix in BAD_PREFIXES:
        with pytest.raises(InvalidArgument):
            store.list(prefix)                               # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.delete_prefix(prefix)                      # type: ignore[arg-type]
    assert store.list("") == []


# --- urls and the store cache ----------------------------------------------------------

@pytest.mark.parametrize("url, normal", [
    ("file:///mnt/archive", "file:///mnt/archive"),
    ("file:///mnt/archive/", "file:///mnt/archive"),
    ("FILE:///mnt/a_b/c-d.e~f", "file:///mnt/a_b/c-d.e~f"),
    ("s3://bucket", "s3://bucket"),
    ("s3://bucket/", "s3://bucket"),
    ("s3://my.bucket-1/pre/fix/", "s3://my.bucket-1/pre/fix"),
])
def test_check_url_good(url: str, normal: str) -> None:
    assert check_url(url) == normal


@pytest.mark.parametrize("url, message", [
    (None, "string"), (5, "string"), ("", "chars"), ("file:///" + "a" * 1024, "chars"),
    ("http://host/x", "file:// or s3://"), ("/mnt/archive", "file:// or s3://"),
    ("gs://bucket", "file:// or s3://"), ("file://host/mnt", "file:///"), ("file://relative", "file:///"),
    ("file:///", "file:///"), ("file:///mnt/../etc", "file:///"), ("file:///mnt//a", "file:///"),
    ("file:///mnt/a b", "file:///"), ("file:///mnt?x=1", "query"), ("s3://[x/y", "IPv6"),
    ("s3://b]/y", "IPv6"), ("s3://[::1]/y", "bucket"), ("s3://bücket", "bucket"), ("s3://", "bucket"),
    ("s3://Bucket", "bucket"), ("s3://b", "bucket"), ("s3://bucket:9000/x", "bucket"),
    ("s3://key:secret@bucket", "bucket"), ("s3://bucket/a/../b", "bucket"),
    ("s3://bucket/" + "p" * 600, "no room"),
])
def test_check_url_bad(url: object, message: str) -> None:
    with pytest.raises(InvalidStreamConfig, match=message):
        check_url(url)


def test_open_store_caches(tmp_path: Path) -> None:
    first = open_store(f"file://{tmp_path}/a/")
    assert isinstance(first, FileStore) and first.url == f"file://{tmp_path}/a"
    assert open_store(f"file://{tmp_path}/a") is first
    assert open_store(f"file://{tmp_path}/b") is not first
    first.close()
    assert open_store(f"file://{tmp_path}/a") is not first
    with pytest.raises(InvalidStreamConfig):
        open_store("ftp://x/y")


def test_open_store_from_threads(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        stores = list(pool.map(lambda _: open_store(f"file://{tmp_path}/t"), range(64)))
    assert all(s is stores[0] for s in stores)
    stores[0].close()


def test_s3_without_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)          # makes `import boto3` fail
    with pytest.raises(InvalidStreamConfig, match=r"pip install 'sms-sps\[s3\]'"):
        S3Store("s3://bucket/x")


# --- the file store's own failures -----------------------------------------------------

def test_file_temp_files_ignored(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}")
    store.put("s/1/a", b"a")
    (tmp_path / "s" / "1" / ".b.tmp-0123456789abcdef").write_bytes(b"half")
    assert store.list("s/") == ["s/1/a"]
    assert store.list("") == ["s/1/a"]
    assert [p.name for p in (tmp_path / "s" / "1").iterdir() if p.name.startswith(".a")] == []


def test_file_root_is_a_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_bytes(b"not a directory")
    store = FileStore(f"file://{root}")
    with pytest.raises(ArchiveUnavailable, match=str(root)):
        store.put("s/1/a", b"x")
    with pytest.raises(ArchiveUnavailable):
        store.put("a", b"x")
    with pytest.raises(ArchiveUnavailable):
        store.list("")
    with pytest.raises(ArchiveUnavailable):
        store.get("a")
    assert os.listdir(tmp_path) == ["root"] and root.read_bytes() == b"not a directory"


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs, mounted for the test (needs root and mount rights)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_file_store_full(small_tmpfs: Path) -> None:
    store = FileStore(f"file://{small_tmpfs}/archive")
    store.put("s/1/small", b"x" * 1000)
    with pytest.raises(ArchiveUnavailable, match="is full"):
        store.put("s/1/big", os.urandom(2 * 1024 * 1024))
    assert sorted(os.listdir(small_tmpfs / "archive" / "s" / "1")) == ["small"]   # no temp file left
    with pytest.raises(FragmentMissing):
        store.get("s/1/big")
    assert store.get("s/1/small") == b"x" * 1000


# --- the S3 store's own failures -------------------------------------------------------

def test_s3_endpoint_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    _aws_env(monkeypatch, f"http://127.0.0.1:{free_port()}", tmp_path)   # nothing listens there
    monkeypatch.setattr(limits, "ARCHIVE_STORE_CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(limits, "ARCHIVE_STORE_READ_TIMEOUT_S", 1.0)
    monkeypatch.setattr(limits, "ARCHIVE_STORE_RETRY_ATTEMPTS", 0)
    store = S3Store("s3://bucket/p")
    for call in (lambda: store.put("a", b"x"), lambda: store.get("a"), lambda: store.list(""),
                 lambda: store.delete("a"), lambda: store.delete_prefix("a/")):
        with pytest.raises(ArchiveUnavailable, match="s3://bucket/p"):
            call()
    store.close()


def test_s3_missing_bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _aws_env(monkeypatch, moto_endpoint, tmp_path)
    store = S3Store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ArchiveUnavailable, match="NoSuchBucket"):
        store.get("a")                                       # not FragmentMissing: the store is wrong
    with pytest.raises(ArchiveUnavailable):
        store.put("a", b"x")
    store.close()


def test_s3_keys_under_prefix(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import boto3
    _aws_env(monkeypatch, moto_endpoint, tmp_path)
    bucket = _new_bucket(moto_endpoint)
    store = S3Store(f"s3://{bucket}/pre/fix")
    store.put("s/1/a", b"x")
    listed = boto3.session.Session().client("s3").list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["pre/fix/s/1/a"]
    assert S3Store(f"s3://{bucket}").list("") == ["pre/fix/s/1/a"]
    store.close()


def test_put_new_writes_once(store: FragmentStore) -> None:
    """put_new (channels' commits: delivery/destinations.py) puts a name only if it is absent:
    of two writers, the second changes nothing and learns it lost."""
    assert store.put_new("c/p0000/1.parquet", b"first") is True
    assert store.put_new("c/p0000/1.parquet", b"second") is False
    assert store.get("c/p0000/1.parquet") == b"first"
    assert store.list("c/") == ["c/p0000/1.parquet"]           # (no temp file left behind)
    assert store.put_new("c/p0000/2.parquet", b"") is True


def test_put_new_races_have_one_winner(store: FragmentStore) -> None:
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: store.put_new("race", b"w%d" % i), range(8)))
    assert won.count(True) == 1
    assert store.get("race") == b"w%d" % won.index(True)
