# PYTHON_ARGCOMPLETE_OK  (argcomplete: `sms` completes its commands and options; see `sms completion`)
"""The `sms` command: run a local cluster or a node, administer streams, put and read.

Human-readable output by default, `--json` for scripts. Client commands find the
cluster from `--address`, else $SMS_ADDRESS, else DIR/cluster.json of `sms up`
(`--data-dir`, default ./sms-data), and first check that something accepts a connection
there (CLI_CONNECT_TIMEOUT_S). Named errors print as `error: Name: message` and exit 1;
usage errors exit 2; Ctrl-C exits 130. Long work (a repartition, a put from stdin, a read)
shows its progress on stderr when that is a terminal (`_progress`), never on stdout.
`sms completion SHELL` prints the shell code of argcomplete's completion.

One module per command group, each adding its own parsers (`add_parsers`): `cluster` (up,
serve, status, demo, config, completion), `streams`, `records` (put, read), `groups`
(consumer), `queues` (queue), `channels` (channel), `nodes`, `access` (key, tenant, certs,
audit), `admin` (bootstrap: the first admin key) and `graphs`; `common` is what they share
(finding the cluster, a client, output, progress).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys

import argcomplete

from node.cli import access, admin, channels, cluster, graphs, groups, nodes, queues, records, streams
from node.cli.common import DEFAULT_DATA_DIR, DISTRIBUTION, ENV_DATA_DIR, attach_completers
from sms import errors


def _version() -> str:
    """The installed distribution's version, else (a source tree not installed) the one
    in pyproject.toml next to this package."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    import tomllib
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "pyproject.toml")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]["version"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`: the version is looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"sms {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", help="any node's HOST:PORT (default: $SMS_ADDRESS or DIR/cluster.json)")
    common.add_argument("--data-dir", default=os.environ.get(ENV_DATA_DIR) or DEFAULT_DATA_DIR,
                        help=f"local cluster directory (default: ${ENV_DATA_DIR}, else ./{DEFAULT_DATA_DIR})")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--token", help="a key's token (default: $SMS_TOKEN, or the admin token of "
                                        "DIR/cluster.json); see `sms key create`")
    common.add_argument("--ca-file", help="the cluster CA's certificate, to reach a TLS cluster by --address "
                                          "(default: $SMS_CA_FILE, or the one DIR/cluster.json names)")

    p = argparse.ArgumentParser(prog="sms", description="SMS: chained-replication stream storage")
    p.add_argument("--version", action=_VersionAction, help="print the version of the sms-sps package and exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    for group in (cluster, streams, records, groups, queues, channels, nodes, access, admin, graphs):
        group.add_parsers(sub, common)
    attach_completers(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:
        # under the shell's completion hook ($_ARGCOMPLETE set) this prints the candidates and
        # exits; otherwise it returns at once
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()        # (a reader gone shows here, not in the interpreter's flush at exit)
        return code
    except errors.SmsError as e:
        print(f"error: {e.name}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_closed()


# `sms ... | head`: the reader of stdout went away. git and coreutils die of SIGPIPE then,
# quietly, and the shell sees status 141 (128 + SIGPIPE); Python ignores SIGPIPE and raises
# BrokenPipeError instead, so the command exits the same way by hand: no traceback, 141.
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE


def _stdout_closed() -> int:
    """No traceback, and stdout pointed at /dev/null: what is still buffered for it has
    nowhere to go, and the interpreter's last flush at exit must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):         # (no stdout file descriptor: nothing will be flushed to it)
        pass
    return EXIT_STDOUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
