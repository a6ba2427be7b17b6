"""The ZooKeeper store's address (`zk://host:port[,host:port...][/prefix]`), its path
rules and the cluster's digest credential."""

from __future__ import annotations

import os
import re
import urllib.parse

from kazoo.security import make_digest_acl

from metastore.base import ROOT, MetaStoreError, validate_path

ZOOKEEPER_SCHEME = "zk"
ZK_DEFAULT_PORT = 2181
ZK_RESERVED_NAME = "zookeeper"       # the server's own subtree at its root

# Characters ZooKeeper refuses in a path (PathUtils.validatePath).
_ZK_FORBIDDEN = re.compile("[\u0001-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff]")




# --- the URL --------------------------------------------------------------------------

def parse_zk_url(url: object) -> tuple[str, str]:
    """(hosts, prefix) of `zk://host:port[,host:port...][/prefix]`: hosts as kazoo
    takes them ("h1:2181,h2:2181", port 2181 if omitted), prefix "" or an absolute
    path without a trailing "/". ValueError on anything else."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"zookeeper url {url!r}: expected a non-empty str")
    expected = f"expected {ZOOKEEPER_SCHEME}://host:port[,host:port...][/prefix]"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != ZOOKEEPER_SCHEME or not url.startswith(f"{ZOOKEEPER_SCHEME}://"):
        raise ValueError(f"zookeeper url {url!r}: {expected}")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"zookeeper url {url!r}: query or fragment; {expected}")
    if not parts.netloc or "@" in parts.netloc:
        raise ValueError(f"zookeeper url {url!r}: {expected}")
    hosts = []
    for item in parts.netloc.split(","):
        try:
            split = urllib.parse.urlsplit(f"//{item}")
            host, port = split.hostname, split.port
        except ValueError as exc:
            raise ValueError(f"zookeeper url {url!r}: bad host {item!r}: {exc}") from None
        if not item or not host or split.username or split.password or split.path:
            raise ValueError(f"zookeeper url {url!r}: bad host {item!r}; {expected}")
        if port == 0 or (port is None and item.endswith(":")):
            raise ValueError(f"zookeeper url {url!r}: bad port in {item!r}")
        host_text = f"[{host}]" if ":" in host else host
        hosts.append(f"{host_text}:{port or ZK_DEFAULT_PORT}")
    prefix = urllib.parse.unquote(parts.path)
    if prefix in ("", ROOT):
        return ",".join(hosts), ""
    try:
        _check_zk_chars(validate_path(prefix))
    except ValueError as exc:
        raise ValueError(f"zookeeper url {url!r}: bad prefix: {exc}") from None
    return ",".join(hosts), prefix


def _check_zk_chars(path: str) -> str:
    match = _ZK_FORBIDDEN.search(path)
    if match is not None:
        raise ValueError(f"path {path!r}: character {match.group()!r} is not allowed"
                         f" by ZooKeeper")
    return path


ENV_ZK_DIGEST = "SMS_ZK_DIGEST"     # "user:password": digest ACLs on every znode the cluster makes


def zk_auth() -> dict:
    """kazoo's arguments for the cluster's digest credential ($SMS_ZK_DIGEST,
    "user:password"; docs/operations.md): the session authenticates with it, and every
    znode it creates (the chroot too) may be read and changed by that user only. None
    set: open ACLs, as before."""
    digest = os.environ.get(ENV_ZK_DIGEST, "")
    if not digest:
        return {}
    user, sep, password = digest.partition(":")
    if not sep or not user or not password:
        raise MetaStoreError(f"${ENV_ZK_DIGEST} must be user:password")
    return {"auth_data": [("digest", digest)], "default_acl": [make_digest_acl(user, password, all=True)]}

