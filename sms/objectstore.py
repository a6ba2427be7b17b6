"""Fragment stores: where a stream's archive keeps its fragment files and payload chunks.

A store is a namespace of objects under one url: `file:///path` (a directory, usually a
mount the nodes share) or `s3://bucket/prefix` (any S3-compatible store, via boto3).
Both behave alike: a put is atomic and durable on return (a reader sees the whole object
or none; a put over a name replaces it), a get of an absent object is FragmentMissing,
listings are sorted, and any other failure (unreachable, refused, full) is
ArchiveUnavailable, which the archiver and readers retry. Calls block: callers run them
on a thread pool. `open_store` keeps one store per url per process.

Names are relative paths of `[A-Za-z0-9_.~/-]` (stream names, a tenant's `~`), checked
here although only our code makes them: no "", "." or ".." segment, no leading "/", and
nothing shaped like the file store's temp files.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import re
import secrets
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from sms import limits
from sms.errors import ArchiveUnavailable, FragmentMissing, InvalidArgument, InvalidStreamConfig

_CHARS = "[A-Za-z0-9_.~/=-]"
_NAME = re.compile(f"{_CHARS}+")
_TEMP = re.compile(r"\..*\.tmp-[0-9a-f]{16}")                # a file store's `.NAME.tmp-<random>`
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")   # S3's rules for a bucket's name
_MISSING_CODES = ("NoSuchKey", "404", "NotFound")
Names = list[str]                                           # (`list` is a method of the stores)


def _segments(path: object, what: str, partial_last: bool = False) -> Names:
    """A name's segments (`partial_last`: a prefix's, whose last may be empty or partial)."""
    if (not isinstance(path, str) or not _NAME.fullmatch(path) or path[0] == "/"
            or len(path) > limits.ARCHIVE_NAME_CHARS_MAX):
        raise InvalidArgument(f"fragment store {what} {str(path)[:80]!r}: expected a relative path"
                              f" of {_CHARS}, at most {limits.ARCHIVE_NAME_CHARS_MAX} chars")
    segments = path.split("/")
    if (any(s in ("", ".", "..") for s in (segments[:-1] if partial_last else segments))
            or _TEMP.fullmatch(segments[-1])):
        raise InvalidArgument(f"fragment store {what} {path[:80]!r}: an empty, '.' or '..' segment,"
                              " or a temp file's name")
    return segments


def check_name(name: str, prefix: bool = False) -> Names:
    """A name's segments, or a listing prefix's ("" is the whole store)."""
    if prefix:
        return [""] if name == "" else _segments(name, "prefix", partial_last=True)
    return _segments(name, "name")


def check_url(url: object) -> str:
    """The archive url normalised (no trailing slash); InvalidStreamConfig if unusable."""
    if not isinstance(url, str):
        raise InvalidStreamConfig(f"archive url must be a string, not {type(url).__name__}")
    if not url or len(url) > limits.ARCHIVE_URL_CHARS_MAX:
        raise InvalidStreamConfig(f"archive url must have 1..{limits.ARCHIVE_URL_CHARS_MAX} chars")
    shown = repr(url[:80])
    try:
        parts = urlsplit(url)
    except ValueError as e:                                 # (a bad '[ipv6]' or non-ASCII host)
        raise InvalidStreamConfig(f"archive url {shown}: {e}") from None
    if "?" in url or "#" in url:
        raise InvalidStreamConfig(f"archive url {shown}: no query or fragment allowed")
    path = parts.path.rstrip("/")
    bad_path = not _NAME.fullmatch(path + "/") or any(s in ("", ".", "..") for s in path.split("/")[1:])
    if parts.scheme == "file":
        if parts.netloc or not path.startswith("/") or bad_path:
            raise InvalidStreamConfig(f"archive url {shown}: expected file:///absolute/path"
                                      f" (no host; {_CHARS}; no '.', '..' or empty segment)")
        return f"file://{path}"
    if parts.scheme == "s3":
        if not _BUCKET.fullmatch(parts.netloc) or (path and bad_path):
            raise InvalidStreamConfig(f"archive url {shown}: expected s3://bucket/optional/prefix"
                                      f" (a valid bucket name; {_CHARS}; no '.', '..' or empty segment)")
        if len(path) + limits.ARCHIVE_NAME_CHARS_MAX > limits.ARCHIVE_S3_KEY_BYTES_MAX:
            raise InvalidStreamConfig(f"archive url {shown}: the prefix leaves no room for names"
                                      f" in S3's {limits.ARCHIVE_S3_KEY_BYTES_MAX}-byte keys")
        return f"s3://{parts.netloc}{path}"
    raise InvalidStreamConfig(f"archive url {shown}: the scheme must be file:// or s3://"
                              " (file:///mnt/archive, s3://bucket/prefix)")


class FragmentStore(abc.ABC):
    url: str                                                # normalised by check_url

    @abc.abstractmethod
    def put(self, name: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def put_new(self, name: str, data: bytes) -> bool:
        """Put `data` as `name` unless an object of that name exists: True if it was put,
        False (and nothing changed) if one was there. Atomic: of two callers, one wins."""

    @abc.abstractmethod
    def get(self, name: str) -> bytes: ...

    @abc.abstractmethod
    def delete(self, name: str) -> None: ...

    @abc.abstractmethod
    def list(self, prefix: str) -> Names:
        """The names (relative to the store) that start with `prefix`, sorted."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (never "": the whole store); how many."""

    def close(self) -> None:
        with _stores_lock:
            if _stores.get(self.url) is self:
                del _stores[self.url]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(FragmentStore):
    """Objects are files under a root directory, made at the first put. A put writes a
    temp file beside its name, fsyncs it, renames it over the name, fsyncs the directory."""

    def __init__(self, url: str) -> None:
        self.url = check_url(url)
        if not self.url.startswith("file://"):
            raise InvalidStreamConfig(f"{self.url!r} is not a file:// url")
        self.root = self.url[len("file://"):]

    def _path(self, segments: Names) -> str:
        return os.path.join(self.root, *segments)

    def _error(self, op: str, path: str, e: OSError) -> ArchiveUnavailable:
        full = " is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        return ArchiveUnavailable(f"fragment store {self.url}{full}: {op} {path}: {e.strerror or e}",
                                  url=self.url)

    @staticmethod
    def _make_dirs(directory: str) -> None:
        """mkdir -p, fsyncing the parent of each directory made so that it survives a crash."""
        missing = []
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for made in reversed(missing):
            with contextlib.suppress(FileExistsError):      # (another writer made it meanwhile)
                os.mkdir(made)
            _fsync_dir(os.path.dirname(made))

    def put(self, name: str, data: bytes) -> None:
        self._put(name, data, replace=True)

    def put_new(self, name: str, data: bytes) -> bool:
        return self._put(name, data, replace=False)

    def _put(self, name: str, data: bytes, replace: bool) -> bool:
        path = self._path(check_name(name))
        directory, base = os.path.split(path)
        temp = os.path.join(directory, f".{base}.tmp-{secrets.token_hex(8)}")
        try:
            for attempt in range(limits.ARCHIVE_STORE_PUT_ATTEMPTS):
                try:
                    self._make_dirs(directory)
                    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    break
                except FileNotFoundError:                   # a delete_prefix pruned a directory
                    if attempt + 1 == limits.ARCHIVE_STORE_PUT_ATTEMPTS:
                        raise
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.replace(temp, path)
            else:
                try:
                    os.link(temp, path)             # (fails when the name exists: of two writers, one wins)
                except FileExistsError:
                    os.unlink(temp)
                    return False
                os.unlink(temp)
            _fsync_dir(directory)
            return True
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise self._error("put", path, e) from e

    def get(self, name: str) -> bytes:
        path = self._path(check_name(name))
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise FragmentMissing(f"fragment store {self.url}: {name} is missing", url=self.url) from None
        except OSError as e:
            raise self._error("get", path, e) from e

    def _unlink(self, path: str) -> bool:
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self._error("delete", path, e) from e

    def delete(self, name: str) -> None:
        self._unlink(self._path(check_name(name)))

    def list(self, prefix: str) -> Names:
        base = check_name(prefix, prefix=True)[:-1]                   # the directory that holds every match
        names: Names = []
        pending = [(self._path(base), "".join(s + "/" for s in base))]
        while pending:
            directory, relative = pending.pop()
            try:
                with os.scandir(directory) as it:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            except (FileNotFoundError, NotADirectoryError) as e:
                if os.path.exists(self.root) and not os.path.isdir(self.root):
                    raise self._error("list", self.root, e) from e
                continue                                    # (nothing there)
            except OSError as e:
                raise self._error("list", directory, e) from e
            for entry, is_dir in entries:
                name = relative + entry
                if is_dir and (name + "/").startswith(prefix):
                    pending.append((os.path.join(directory, entry), name + "/"))
                elif not is_dir and name.startswith(prefix) and not _TEMP.fullmatch(entry):
                    names.append(name)
        return sorted(names)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise InvalidArgument("delete_prefix of the whole store refused")
        paths = [self._path(name.split("/")) for name in self.list(prefix)]
        deleted = sum(self._unlink(path) for path in paths)
        # prune the directories left empty, deepest first, up to (not including) the root
        for directory in sorted({os.path.dirname(p) for p in paths}, key=len, reverse=True):
            while directory.startswith(self.root + "/"):
                try:
                    os.rmdir(directory)
                except OSError:
                    break                                   # (not empty, or already gone)
                directory = os.path.dirname(directory)
        return deleted


class S3Store(FragmentStore):
    """Objects are keys `prefix/name` of one bucket. The endpoint and the credentials are
    boto3's own (AWS_ENDPOINT_URL[_S3], AWS_ACCESS_KEY_ID, profiles, instance roles)."""

    def __init__(self, url: str) -> None:
        self.url = check_url(url)
        if not self.url.startswith("s3://"):
            raise InvalidStreamConfig(f"{self.url!r} is not an s3:// url")
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError:
            raise InvalidStreamConfig("s3:// archives need boto3: pip install 'sms-sps[s3]'") from None
        self.bucket, _, self.prefix = self.url[len("s3://"):].partition("/")
        self._errors = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)
        config = botocore.config.Config(
            connect_timeout=limits.ARCHIVE_STORE_CONNECT_TIMEOUT_S,
            read_timeout=limits.ARCHIVE_STORE_READ_TIMEOUT_S,
            retries={"max_attempts": limits.ARCHIVE_STORE_RETRY_ATTEMPTS, "mode": "standard"})
        # a session of its own: boto3's default session is not safe to share across threads
        self._client: Any = boto3.session.Session().client("s3", config=config)

    def _key(self, name: str, prefix: bool = False) -> str:
        check_name(name, prefix)
        return f"{self.prefix}/{name}" if self.prefix else name

    @contextlib.contextmanager
    def _calling(self, op: str, name: str) -> Iterator[None]:
        """boto3's errors as ours: NoSuchKey is FragmentMissing, any other unavailable."""
        try:
            yield
        except self._errors as e:
            if getattr(e, "response", {}).get("Error", {}).get("Code") in _MISSING_CODES:
                raise FragmentMissing(f"fragment store {self.url}: {name} is missing", url=self.url) from None
            raise ArchiveUnavailable(f"fragment store {self.url}: {op} {name}: {e}", url=self.url) from e

    def put(self, name: str, data: bytes) -> None:
        with self._calling("put", name):
            self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def put_new(self, name: str, data: bytes) -> bool:
        try:
            with self._calling("put", name):
                self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, IfNoneMatch="*")
            return True
        except ArchiveUnavailable as e:
            cause = e.__cause__
            code = getattr(cause, "response", {}).get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False                # (a conflict: another writer's put of the name won, or is winning)
            raise

    def get(self, name: str) -> bytes:
        with self._calling("get", name):
            return bytes(self._client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read())

    def delete(self, name: str) -> None:
        with self._calling("delete", name):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def _pages(self, prefix: str) -> Iterator[Names]:
        """The keys under prefix, a page (of at most one delete batch) at a time."""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(prefix, prefix=True),
            PaginationConfig={"PageSize": limits.ARCHIVE_S3_DELETE_BATCH_MAX})
        for page in pages:
            yield [item["Key"] for item in page.get("Contents", ())]

    def list(self, prefix: str) -> Names:
        strip = len(self.prefix) + 1 if self.prefix else 0
        with self._calling("list", prefix):
            return sorted(key[strip:] for keys in self._pages(prefix) for key in keys)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise InvalidArgument("delete_prefix of the whole store refused")
        deleted = 0
        with self._calling("delete_prefix", prefix):
            for keys in filter(None, self._pages(prefix)):
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
                if failed := answer.get("Errors", []):
                    raise ArchiveUnavailable(f"fragment store {self.url}: delete {failed[0].get('Key')}:"
                                             f" {failed[0].get('Message')} ({len(failed)} keys)", url=self.url)
                deleted += len(keys)
        return deleted

    def close(self) -> None:
        super().close()
        self._client.close()


_stores: dict[str, FragmentStore] = {}
_stores_lock = threading.Lock()


def open_store(url: str) -> FragmentStore:
    """The process's store for `url` (made at first use; one per normalised url)."""
    url = check_url(url)
    with _stores_lock:
        if url not in _stores:
            _stores[url] = FileStore(url) if url.startswith("file://") else S3Store(url)
        return _stores[url]
