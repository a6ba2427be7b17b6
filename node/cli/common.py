"""What every `sms` command shares: finding the cluster (`_address`), a client, output (`_emit`) and
progress on stderr (`_progress`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator

from sms import limits, security


DEFAULT_DATA_DIR = "sms-data"
ENV_DATA_DIR = "SMS_DATA_DIR"     # the local cluster directory of every command that takes --data-dir


DEFAULT_PORT = 7480


DISTRIBUTION = "sms-sps"          # the package `sms --version` names (pyproject.toml's project.name)


def _address(args) -> str:
    """The cluster's address. Its CA, when known here (--ca-file, or the cluster.json of
    `sms up`), goes into $SMS_CA_FILE, which every client of this process and of the
    workers it starts reads (sms/security.py); "" there means plaintext. Each command calls
    it once: it exits with one line when nothing accepts a connection there."""
    if getattr(args, "ca_file", None):
        os.environ[security.ENV_CA_FILE] = os.path.abspath(args.ca_file)
    if getattr(args, "token", None):
        os.environ[security.ENV_TOKEN] = args.token
    if args.address:
        return _answering(args.address, "--address")
    if os.environ.get("SMS_ADDRESS"):
        return _answering(os.environ["SMS_ADDRESS"], "$SMS_ADDRESS")
    path = os.path.join(args.data_dir, "cluster.json")
    try:
        with open(path) as f:
            info = json.load(f)
        address = info["address"]
    except (OSError, ValueError, KeyError):
        raise SystemExit(f"error: no cluster address: pass --address, set SMS_ADDRESS, or run `sms up` "
                         f"(looked for {path})") from None
    if not getattr(args, "ca_file", None):
        os.environ[security.ENV_CA_FILE] = info.get("ca_file", "")
    if not getattr(args, "token", None) and not os.environ.get(security.ENV_TOKEN):
        os.environ[security.ENV_TOKEN] = info.get("token", "")
    return _answering(address, path)


def _answering(address: str, source: str) -> str:
    """`address` ("host:port[,host:port...]"), once one of its nodes accepts a TCP
    connection within CLI_CONNECT_TIMEOUT_S; else exit with one line. (Without this a
    stopped cluster costs an admin command CLIENT_LEADER_WAIT_S of retries, then gRPC's
    own text.) Only the connection is checked: TLS and the calls report their own errors."""
    from kernel import rpc
    seeds = [a.strip() for a in address.split(",") if a.strip()]

    async def probe() -> list[str]:
        return await asyncio.gather(*(rpc.probe_port(a, limits.CLI_CONNECT_TIMEOUT_S) for a in seeds))

    if rpc.PROBE_LISTENING not in asyncio.run(probe()):
        raise SystemExit(f"error: no cluster answers at {address} (from {source}): is it running? "
                         f"(`sms up` starts one)")
    return address


def _client(args):
    from sms.client import Client
    return Client(_address(args))


def _emit(args, obj, human: str) -> None:
    print(json.dumps(obj, indent=2, default=str) if args.json else human)


@contextlib.contextmanager
def _progress(first: str, *, stdout_too: bool = False) -> Iterator[Callable[[str], None] | None]:
    """A line of progress on long work (a spinner, `first` then what `update(text)` says,
    the time elapsed), drawn with rich on stderr and erased at the end; only when stderr is
    a terminal (rich's test: FORCE_COLOR and TTY_COMPATIBLE count too), so scripts, pipes
    and logs see exactly what they did without it. Yields `update`, or None when nothing is
    shown. Nothing goes to stdout. `stdout_too`: the command prints to stdout meanwhile,
    so the line is shown only when stdout is not a terminal (records on the screen are
    progress enough, and would tear the line)."""
    from rich.console import Console
    console = Console(stderr=True)
    if not console.is_terminal or (stdout_too and sys.stdout.isatty()):
        yield None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(first)
        yield lambda text: bar.update(task, description=text)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def _local_data_dir(args) -> str | None:
    """--data-dir, when the cluster this command reached is the one `sms up` runs there
    (its address came from DIR/cluster.json, not from --address or $SMS_ADDRESS)."""
    if args.address or os.environ.get("SMS_ADDRESS"):
        return None
    return args.data_dir if os.path.exists(os.path.join(args.data_dir, "cluster.json")) else None


# --- completion of names (argcomplete): streams, groups, nodes, queues, channels, tenants ----

def _names_of(kind: str, parsed_args) -> list[str]:
    """The names a running cluster has of `kind`; [] when it cannot say (no cluster, no
    rights, a slow answer): completion never fails a shell."""
    from sms.client import Client
    args = argparse.Namespace(**{"address": None, "data_dir": os.environ.get(ENV_DATA_DIR) or DEFAULT_DATA_DIR,
                                 "token": None, "ca_file": None, **vars(parsed_args)})
    try:
        with Client(_address(args)) as client:
            if kind == "stream":
                return client.list_streams()
            if kind == "group":
                return client.list_groups(args.stream) if getattr(args, "stream", None) else []
            if kind == "node":
                return sorted({n.node_id for n in client.list_nodes()})
            if kind == "queue":
                return [q.name for q in client.list_queues()]
            if kind == "channel":
                return [c.name for c in client.list_channels()]
            if kind == "tenant":
                return client.list_tenants()
    except BaseException:     # noqa: BLE001 (SystemExit of _address included: nothing to offer)
        return []
    return []


def _completer(kind: str) -> Callable[..., list[str]]:
    def complete(prefix: str, parsed_args, **_kwargs) -> list[str]:
        return [n for n in _names_of(kind, parsed_args) if n.startswith(prefix)]
    return complete


# which positional arguments name what exists, by their help text (the `name` of "create" and
# "import" is something new: nothing to complete there)
_KINDS = {"the stream's name": "stream", "the stream it delivers": "stream", "the consumer group's name": "group",
          "the storage node, as `sms node list` shows it": "node", "the queue's name": "queue",
          "the channel's name": "channel", "the tenant's name": "tenant"}


def attach_completers(parser: argparse.ArgumentParser, new: bool = False) -> None:
    """Give every positional argument that names a stream, group, node, queue, channel or
    tenant a completer of the running cluster's names (`sms completion`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                attach_completers(sub, new=name in ("create", "import"))
        elif not action.option_strings and action.help in _KINDS and not (new and action.dest == "name"):
            action.completer = _completer(_KINDS[action.help])  # type: ignore[attr-defined]
