"""The credentials of a test run: one CA that every cluster's node certificates come from,
and one token that every cluster's first admin key has and every client presents.

pytest makes them at start (tests/conftest.py `pytest_configure`); the trial runners
(`python -m tests.fault.trials`, `python -m tests.netfault.trials`) make them the same way
when run on their own, so that their clusters and their clients (the workload, producer
processes, the CLI) agree on TLS and the key without pytest. A CA given from outside
($SMS_CA_DIR) is used as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from control import auth
from node.launcher import ENV_BOOTSTRAP_TOKEN, ENV_CA_DIR
from sms import security


def make() -> str:
    """A CA and a token for this process and the ones it starts ($SMS_CA_DIR,
    $SMS_CA_FILE, $SMS_BOOTSTRAP_TOKEN, $SMS_TOKEN). Returns the CA's temporary directory
    ("" when $SMS_CA_DIR was given: nothing made)."""
    if os.environ.get(ENV_CA_DIR):
        return ""
    from node import certs
    ca_dir = tempfile.mkdtemp(prefix="sms-test-ca-")
    issued = certs.init_ca(ca_dir, name="sms test CA")
    os.environ[ENV_CA_DIR] = ca_dir
    os.environ[security.ENV_CA_FILE] = issued.cert_file
    token = auth.new_token()[1]
    os.environ[ENV_BOOTSTRAP_TOKEN] = token
    os.environ[security.ENV_TOKEN] = token
    return ca_dir


def remove(ca_dir: str) -> None:
    if ca_dir:
        shutil.rmtree(ca_dir, ignore_errors=True)


@contextlib.contextmanager
def for_this_run() -> Iterator[None]:
    """`make` for the duration of a block (a trial runner's main), then `remove`."""
    ca_dir = make()
    try:
        yield
    finally:
        remove(ca_dir)
