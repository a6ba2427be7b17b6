"""`sms key`, `tenant`, `certs` and `audit`: who may do what, and what they did."""

from __future__ import annotations

import argparse
import os
import sys
import time

from node.cli.common import _client, _emit, _when
from sms import errors, limits, security
from sms.aio import TENANT_LIMITS


def cmd_key(args) -> int:
    if args.key_cmd == "aws":
        return _aws(args)
    with _client(args) as client:
        if args.key_cmd == "create":
            info, token = client.create_key(args.role, streams=args.stream, name=args.name, tenant=args.tenant)
            aws_id, aws_secret = security.aws_credentials(token)
            _emit(args, {**info, "token": token, "aws_access_key_id": aws_id, "aws_secret_access_key": aws_secret},
                  f"key {info['key_id']} ({info['role']}"
                  + (f" of {', '.join(info['streams'])}" if info["streams"] else "") + ")\n"
                  f"token: {token}\n"
                  f"AWS credentials for the Kinesis endpoint: access key id {aws_id}, secret access key {aws_secret}\n"
                  f"(shown this once: the cluster keeps only the token's hash, and the secret wrapped by its master "
                  f"key; `sms key aws --token ...` derives them again)")
        elif args.key_cmd == "list":
            keys = client.list_keys()
            width = max([len("tenant")] + [len(k["tenant"]) for k in keys])
            lines = [f"{'key':<18} {'tenant':<{width}} {'role':<9} {'streams':<30} name"]
            lines += [f"{k['key_id']:<18} {k['tenant']:<{width}} {k['role']:<9} "
                      f"{','.join(k['streams']) or '(all)':<30} {k['name']}" for k in keys]
            _emit(args, keys, "\n".join(lines))
        elif args.key_cmd == "rotate-master":
            _rotate_master(args, client)
        else:
            client.revoke_key(args.key_id)
            _emit(args, {"revoked": args.key_id}, f"revoked {args.key_id}")
    return 0


def _aws(args) -> int:
    """The AWS credentials of a key (its token: --token, $SMS_TOKEN, or the admin token of
    DIR/cluster.json), and the cluster's Kinesis endpoint, as the AWS CLI and SDKs take them."""
    import json as json_module
    info: dict = {}
    try:
        with open(os.path.join(args.data_dir, "cluster.json")) as f:
            info = json_module.load(f)
    except (OSError, ValueError):
        pass
    token = args.token or os.environ.get(security.ENV_TOKEN) or info.get("token", "")
    if not token:
        raise SystemExit("error: no key: pass --token, set $SMS_TOKEN, or run `sms up` (its admin token)")
    try:
        key_id, secret = security.aws_credentials(token)
    except errors.InvalidArgument as e:
        raise SystemExit(f"error: {e.message}") from None
    endpoint = info.get("kinesis_endpoint", "")
    ca = info.get("ca_file", "")
    # (AWS_ENDPOINT_URL_KINESIS: botocore, the AWS CLI and the other SDKs send Kinesis calls
    # there without --endpoint-url or endpoint_url=)
    env = (f"export AWS_ACCESS_KEY_ID={key_id} AWS_SECRET_ACCESS_KEY={secret} AWS_DEFAULT_REGION=us-east-1"
           + (f" AWS_CA_BUNDLE={ca}" if ca else "") + (f" AWS_ENDPOINT_URL_KINESIS={endpoint}" if endpoint else ""))
    _emit(args, {"aws_access_key_id": key_id, "aws_secret_access_key": secret, "endpoint_url": endpoint,
                 "ca_bundle": ca},
          f"{env}\n" + ("# then: aws kinesis list-streams" if endpoint else
                        "# (no Kinesis endpoint recorded in cluster.json: give --endpoint-url)"))
    return 0


def _rotate_master(args, client) -> None:
    """Master key rotation (docs/security.md): a new key in the key file, made current, then
    every encrypted stream's data key wrapped by it. On several hosts, put the new file on
    every host first (--no-new-key then only re-wraps)."""
    from kernel import encryption
    path = args.key_file or os.path.join(args.data_dir, "tls", "master.key")
    if not os.path.exists(path):
        raise SystemExit(f"error: no master key file at {path} (--key-file)")
    new_id = "" if args.no_new_key else encryption.add_master_key(path)
    count = client.rewrap_data_keys()
    _emit(args, {"key_file": path, "new_key": new_id, "rewrapped": count},
          (f"new master key {new_id} in {path}; " if new_id else "") + f"{count} data keys wrapped by it "
          "(the older keys may leave the file now)")


def _tenant_limits(t: dict) -> str:
    shown = [f"{k.replace('_per_s', '')} {v:,}/s" if k.endswith("_per_s") else f"{k} {v:,}"
             for k, v in t.items() if k in TENANT_LIMITS and v]
    return ", ".join(shown) or "no limits"


def cmd_tenant(args) -> int:
    with _client(args) as client:
        if args.tenant_cmd == "create":
            client.create_tenant(args.name)
            _emit(args, {"created": args.name}, f"tenant {args.name} created")
        elif args.tenant_cmd == "list":
            tenants = client.describe_tenants()
            _emit(args, tenants, "\n".join(t["name"] + "  " + _tenant_limits(t) for t in tenants))
        elif args.tenant_cmd == "update":
            t = client.update_tenant(args.name, **{f: getattr(args, f) for f in TENANT_LIMITS})
            _emit(args, t, f"tenant {t['name']}: {_tenant_limits(t)}")
        else:
            client.delete_tenant(args.name)
            _emit(args, {"deleted": args.name}, f"tenant {args.name} deleted")
    return 0


def cmd_certs(args) -> int:
    from node import certs
    if args.certs_cmd == "init":
        out = certs.init_ca(args.dir, days=args.days)
        _emit(args, {"ca_file": os.path.abspath(out.cert_file), "key_file": os.path.abspath(out.key_file)},
              f"CA certificate {out.cert_file} (clients and nodes trust it)\n"
              f"CA key         {out.key_file} (mode 0600: whoever holds it can issue certificates)")
        return 0
    if args.certs_cmd == "revoke":
        with _client(args) as client:
            serial = client.revoke_certificate(args.certificate, args.reason)
        _emit(args, {"revoked": serial}, f"certificate {serial} revoked: no cluster port serves it from now on")
        return 0
    if args.certs_cmd == "revoked":
        with _client(args) as client:
            revoked = client.list_revoked_certificates()
        _emit(args, revoked, "\n".join(f"{c['serial']}  {_when(c['revoked_ms'])}  {c['reason']}" for c in revoked)
              or "no certificate is revoked")
        return 0
    out = certs.issue(args.ca_dir, args.out, node=args.node or "", client=args.client or "",
                      hosts=tuple(args.host), days=args.days)
    _emit(args, {"cert_file": os.path.abspath(out.cert_file), "key_file": os.path.abspath(out.key_file),
                 "serial": security.cert_serial(out.cert_file)},
          f"certificate {out.cert_file} (serial {security.cert_serial(out.cert_file)})\n"
          f"key         {out.key_file} (mode 0600)")
    return 0


_AGO_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _since_ms(text: str, now_ms: int | None = None) -> int:
    """`--since`: how long ago ("90s", "15m", "2h", "7d"), a UTC time ("2026-11-28",
    "2026-11-28T16:00:00Z", "2026-11-28 16:00"), or ms since the epoch."""
    import datetime
    text = text.strip()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if text[-1:] in _AGO_UNITS_S and text[:-1].replace(".", "", 1).isdigit():
        return max(0, now_ms - int(float(text[:-1]) * _AGO_UNITS_S[text[-1]] * 1000))
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected how long ago (90s, 15m, 2h, 7d), a UTC time "
                                         f"(2026-11-28T16:00:00Z) or ms since the epoch") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0, int(when.timestamp() * 1000))


def _audit_limit(text: str) -> int:
    n = int(text) if text.strip().isdigit() else 0
    if not 1 <= n <= limits.AUDIT_READ_EVENTS_MAX:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 to {limits.AUDIT_READ_EVENTS_MAX}")
    return n


def _audit_who(who: dict) -> str:
    """An audit line's `who` in words (kernel/audit.py)."""
    if "key_id" in who:
        return f"key {who['key_id']} ({who.get('role', '?')} of {who.get('tenant', '?')})"
    if "claimed_key_id" in who:
        return f"a token claiming key {who['claimed_key_id']}"
    if "node" in who:
        return f"node {who['node']} (certificate {who.get('serial', '?')})"
    if "cert" in who:
        return f"certificate {who['cert']} ({who.get('unit', '?')}, {who.get('serial', '?')})"
    return "(cut)" if who.get("cut") else "(no credential)"


def _audit_line(e: dict) -> str:
    line = (f"{e.get('time', '?')}  {e.get('node', '?'):<8} {e.get('action', '?'):<19} {e.get('target') or '-'}  "
            f"{e.get('outcome', '?')}  by {_audit_who(e.get('who') or {})}  from {e.get('from') or '?'}")
    return line + (f"  {e['detail']}" if e.get("detail") else "")


def cmd_audit(args) -> int:
    """`sms audit`: every node's audit log (kernel/audit.py), merged by time."""
    with _client(args) as client:
        got = client.read_audit(args.since or 0, args.limit)
    for node_id, error in sorted(got["unanswered"].items()):
        print(f"warning: node {node_id} did not answer ({error}): its events are missing", file=sys.stderr)
    if got["truncated"]:
        print(f"note: older events were left out: the newest {args.limit} are shown (--since, --limit)",
              file=sys.stderr)
    _emit(args, got, "\n".join(_audit_line(e) for e in got["events"]) or "no audit events")
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    key = sub.add_parser("key", help="credentials: keys with a role (admin, producer, consumer, monitor)")
    ksub = key.add_subparsers(dest="key_cmd", required=True)
    kc = ksub.add_parser("create", parents=[common], help="a new key; its token is printed this once")
    kc.add_argument("--role", required=True, choices=["admin", "producer", "consumer", "monitor"],
                    help="admin: everything; producer: write; consumer: read; monitor: /metrics only (Prometheus)")
    kc.add_argument("--stream", action="append", default=[], help="limit the key to this stream (repeat)")
    kc.add_argument("--name", default="", help="what the key is for")
    kc.add_argument("--tenant", default="", help="the key's tenant (default: the caller's own)")
    ksub.add_parser("list", parents=[common], help="every key: id, tenant, role, streams, name (never a secret)")
    ksub.add_parser("aws", parents=[common], help="a key's AWS credentials for the Kinesis endpoint (of --token, "
                                               "$SMS_TOKEN or the cluster's admin token), as shell exports")
    kr = ksub.add_parser("revoke", parents=[common], help="delete a key: returns once no node admits its token any more (about a second)")
    kr.add_argument("key_id", help="the key's id, as `sms key list` shows it")
    km = ksub.add_parser("rotate-master", parents=[common],
                         help="encryption at rest: a new master key in the key file, then every stream's data key "
                              "wrapped by it")
    km.add_argument("--key-file", default="", help="the master key file (default: DIR/tls/master.key of `sms up`)")
    km.add_argument("--no-new-key", action="store_true",
                    help="only re-wrap, by the current key of the leader's file (a new one was put on every host)")
    key.set_defaults(func=cmd_key)

    tenant = sub.add_parser("tenant", help="tenants: each sees only its own streams, under its own names")
    tsub = tenant.add_subparsers(dest="tenant_cmd", required=True)
    tc = tsub.add_parser("create", parents=[common], help="a new tenant (then: sms key create --tenant NAME)")
    tc.add_argument("name", help="the tenant's name ([a-z0-9-])")
    tsub.add_parser("list", parents=[common], help="every tenant, with its limits")
    tu = tsub.add_parser("update", parents=[common], help="a tenant's limits: throughput over all its partitions, "
                                                          "and caps on what it holds (0 removes one)")
    tu.add_argument("name", help="the tenant's name")
    tu.add_argument("--write-records-per-s", type=int, help="records/s written over all its partitions")
    tu.add_argument("--write-bytes-per-s", type=int, help="bytes/s written over all its partitions")
    tu.add_argument("--read-bytes-per-s", type=int, help="bytes/s read over all its partitions")
    tu.add_argument("--streams-max", type=int, help="streams it may have")
    tu.add_argument("--partitions-max", type=int, help="open partitions over all its streams")
    tu.add_argument("--retention-hours-max", type=int,
                    help="hours its records may be kept (its streams' retention, and unread records protected)")
    td = tsub.add_parser("delete", parents=[common], help="delete a tenant without streams, and its keys")
    td.add_argument("name", help="the tenant's name")
    tenant.set_defaults(func=cmd_tenant)

    certs = sub.add_parser("certs", help="a cluster CA, and certificates for nodes and clients (TLS)")
    csub = certs.add_subparsers(dest="certs_cmd", required=True)
    ci = csub.add_parser("init", help="create a CA: DIR/ca.pem (give it to clients) and DIR/ca.key (keep it safe)")
    ci.add_argument("--dir", required=True, help="where the CA goes")
    ci.add_argument("--days", type=int, default=3650, help="how long the CA certificate is valid (default 3650)")
    ci.add_argument("--json", action="store_true", help="machine-readable output")
    cs = csub.add_parser("issue", help="a node's or a client's certificate and key, signed by the CA")
    cs.add_argument("--ca-dir", required=True, help="the CA's directory (`sms certs init --dir`)")
    who = cs.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", help="a node id: the certificate `sms serve --node-id ID` serves with")
    who.add_argument("--client", help="a client's name: a certificate a client may present")
    cs.add_argument("--host", action="append", default=[],
                    help="a name or address clients reach the node at (repeat; localhost is always in)")
    cs.add_argument("--out", default=".", help="directory for NAME.pem and NAME.key (default .)")
    cs.add_argument("--days", type=int, default=825, help="how long the certificate is valid (default 825)")
    cs.add_argument("--json", action="store_true", help="machine-readable output")
    cr = csub.add_parser("revoke", parents=[common],
                         help="no cluster port serves this certificate any more (a node key that leaked)")
    cr.add_argument("certificate", help="its PEM file, or its serial in hex (`sms certs issue` prints it)")
    cr.add_argument("--reason", default="", help="kept with it, shown by `sms certs revoked`")
    csub.add_parser("revoked", parents=[common], help="the revoked certificates")
    certs.set_defaults(func=cmd_certs)

    aud = sub.add_parser("audit", parents=[common], help="the audit log: who changed what, refused calls (every node)",
                         description="Every node's audit events (docs/security.md, \"Audit log\"), merged by time: "
                                     "changes of streams, tenants, keys, certificates, nodes and consumer groups, and "
                                     "refused credentials and calls; who, what, the outcome and from where. Admins "
                                     "of the default tenant only.")
    aud.add_argument("--since", type=_since_ms, help="events from then on: how long ago (90s, 15m, 2h, 7d), a UTC "
                                                     "time (2026-11-28T16:00:00Z) or ms since the epoch "
                                                     "(default: every event kept)")
    aud.add_argument("--limit", type=_audit_limit, default=limits.AUDIT_READ_EVENTS_MAX, metavar="N",
                     help=f"the newest N events (default and most: {limits.AUDIT_READ_EVENTS_MAX})")
    aud.set_defaults(func=cmd_audit)
