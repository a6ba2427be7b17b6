"""`sms admin`: what an operator does once, off the cluster. `bootstrap` makes the token
of a cluster's first admin key in a file of mode 0600; the control node that starts with
it (`sms serve --bootstrap-token-file FILE`, or node.bootstrap_token_file in its
configuration) turns it into an admin key once in the cluster's life
(control/auth.py, `bootstrap_admin_key`). Nothing here talks to a cluster."""

from __future__ import annotations

import argparse
import os

from node.cli.common import _emit


def write_token_file(path: str, force: bool = False) -> str:
    """A new admin token in `path` (0600, created; replaced only with `force`): its key id.
    Raises FileExistsError (without `force`) and OSError."""
    from control import auth
    key_id, token = auth.new_token()
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    # written beside it, then renamed over it: the file is whole, and 0600, from its first byte
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)          # (fails with FileExistsError: an existing token stays)
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return key_id


def _bootstrap(args) -> int:
    path = args.token_file
    try:
        key_id = write_token_file(path, force=args.force)
    except FileExistsError:
        raise SystemExit(f"error: {path} exists: it may hold the token of the cluster's admin key already "
                         f"(--force replaces it; a cluster started once keeps the key it made first)") from None
    except OSError as e:
        raise SystemExit(f"error: {path}: {e.strerror or e}") from None
    _emit(args, {"key_id": key_id, "token_file": os.path.abspath(path)},
          f"admin key {key_id}: its token is in {path} (mode 0600)\n"
          f"start the first control node with --bootstrap-token-file {path} (or node.bootstrap_token_file); "
          f"clients: export SMS_TOKEN=$(cat {path})")
    return 0


def cmd_admin(args) -> int:
    if args.admin_cmd == "bootstrap":
        return _bootstrap(args)
    raise AssertionError(f"sms admin {args.admin_cmd}: no such command")


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    admin = sub.add_parser("admin", help="once in a cluster's life: the first admin key")
    asub = admin.add_subparsers(dest="admin_cmd", required=True)
    boot = asub.add_parser(
        "bootstrap", help="the token of the cluster's first admin key, in a file (mode 0600)",
        description="Write a new admin token to FILE (mode 0600). The control node started with "
                    "--bootstrap-token-file FILE (or node.bootstrap_token_file in its configuration) makes it the "
                    "cluster's first admin key, once in the cluster's life; later starts ignore it. Make the other "
                    "keys with `sms key create`, then keep the file safe or revoke that key. Talks to no cluster.")
    boot.add_argument("--token-file", required=True, metavar="FILE", help="where the token goes (created; its "
                                                                         "directory too, mode 0700)")
    boot.add_argument("--force", action="store_true", help="replace FILE if it exists")
    boot.add_argument("--json", action="store_true", help="machine-readable output (the key id and the file; the "
                                                          "token stays in the file)")
    admin.set_defaults(func=cmd_admin)
