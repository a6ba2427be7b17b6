"""`sms channel create|describe|list|update|delete` and the channel lines of `sms status`
(node/cli/channels.py, docs/channels.md, "sms channel"), driven as a user drives them: each command a
separate `python -m node` process against one `sms up` of one storage node (test_cli.py's
`Up`, `sms_cmd` and `ok`).

A FILES channel into a temporary directory delivers what `sms put` wrote; describe shows
each partition's progress, list and status show the channel, update changes its freshness;
bad input (a destination, a schema, a freshness, an unknown channel or stream) is one line
naming the error, a nonzero exit, and changes nothing; delete leaves the files.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import wait_until
from tests.integration import test_cli as cli

pytestmark = pytest.mark.integration

RECORDS = 100
DELIVERY_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def up(tmp_path_factory) -> Iterator[cli.Up]:
    started = cli.Up(str(tmp_path_factory.mktemp("up")), nodes=1)
    try:
        started.wait_for_address()
        yield started
    finally:
        started.stop()


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _refused(d: str, error: str, *args: str) -> str:
    done = cli.sms_cmd(d, "channel", *args)
    assert done.returncode == 1, done
    line = _one_line(done.stderr)
    assert line.startswith(f"error: {error}: "), line
    assert done.stdout == "", done
    return line


def _channels(d: str) -> list[dict]:
    return json.loads(cli.ok(cli.sms_cmd(d, "channel", "list", "--json")))


def test_channel_commands(up, tmp_path):
    d = up.data_dir
    out = tmp_path / "out"
    cli.ok(cli.sms_cmd(d, "stream", "create", "clicks", "--partitions", "2"))

    # bad input: one named line each, and no channel made
    _refused(d, "InvalidArgument", "create", "clicks", "bad", "ftp://host/x")
    _refused(d, "InvalidArgument", "create", "clicks", "bad", "file://relative/dir")
    _refused(d, "InvalidArgument", "create", "clicks", "bad", "iceberg://Bad-Name.t")
    _refused(d, "InvalidArgument", "create", "clicks", "bad", f"file://{out}", "--catalog-uri", "sqlite:////x.db")
    _refused(d, "InvalidArgument", "create", "clicks", "bad", f"file://{out}", "--key-template", "{stream}.parquet")
    line = _refused(d, "InvalidArgument", "create", "clicks", "bad", f"file://{out}", "--schema", "user",
                    "--dead-letter-url", f"file://{tmp_path}/dead")
    assert "--schema" in line and "name:type" in line, line
    _refused(d, "InvalidArgument", "create", "clicks", "bad", f"file://{out}", "--schema", "n:int128",
             "--dead-letter-url", f"file://{tmp_path}/dead")
    _refused(d, "InvalidArgument", "create", "clicks", "bad", f"file://{out}", "--schema", "n:long")   # no dead letters
    _refused(d, "InvalidArgument", "create", "clicks", "bad", f"file://{out}", "--freshness", "901")
    _refused(d, "InvalidArgument", "create", "clicks", "bad/name", f"file://{out}")
    _refused(d, "StreamNotFound", "create", "no-such-stream", "bad", f"file://{out}")
    for command in (("describe", "none"), ("update", "none", "--freshness", "5"), ("delete", "none")):
        assert "'none'" in _refused(d, "ChannelNotFound", *command)
    assert _channels(d) == []
    assert cli.ok(cli.sms_cmd(d, "channel", "list")).strip() == "no channels"
    assert not out.exists()

    # create, and records put are delivered into Parquet files
    made = json.loads(cli.ok(cli.sms_cmd(d, "channel", "create", "clicks", "tofiles", f"file://{out}",
                                         "--freshness", "1", "--compression", "GZIP", "--json")))
    assert (made["name"], made["stream"], made["status"], made["start"], made["data_freshness_s"],
            made["record_format"]) == ("tofiles", "clicks", "ACTIVE", "TRIM_HORIZON", 1, "BYTES")
    assert made["destination"]["kind"] == "FILES" and made["destination"]["url"] == f"file://{out}"
    assert made["destination"]["compression"] == "GZIP"
    _refused(d, "ChannelAlreadyExists", "create", "clicks", "tofiles", f"file://{out}")
    cli.ok(cli.sms_cmd(d, "put", "clicks", stdin="".join(f"click {i}\n" for i in range(RECORDS))))

    def delivered() -> dict | None:
        c = json.loads(cli.ok(cli.sms_cmd(d, "channel", "describe", "tofiles", "--json")))
        return c if sum(p["records"] for p in c["partitions"]) >= RECORDS else None

    described = wait_until(delivered, DELIVERY_TIMEOUT_S, f"{RECORDS} records delivered")
    assert sum(p["records"] for p in described["partitions"]) == RECORDS
    assert [p["partition_id"] for p in described["partitions"]] == ["p0000", "p0001"]
    assert all(p["files"] >= 1 and p["error"] == "" and p["last_commit_ms"] > 0 and p["node"]
               for p in described["partitions"])
    assert glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True)

    text = cli.ok(cli.sms_cmd(d, "channel", "describe", "tofiles")).splitlines()
    assert text[0].startswith(f"tofiles  on clicks  ACTIVE  to file://{out} (GZIP Parquet, "), text
    assert "from TRIM_HORIZON  freshness 1 s  BYTES" in text[0], text
    parts = text[1:]
    assert [line.split()[0] for line in parts] == ["p0000", "p0001"], text
    for line, p in zip(parts, described["partitions"]):
        assert f"records {p['records']}  files {p['files']}  dead letters 0  committed " in line, line
        assert " s ago  lag " in line and f"  node {p['node']}" in line and "FAILING" not in line, line

    # list (all, and of one stream)
    listed = cli.ok(cli.sms_cmd(d, "channel", "list")).splitlines()
    assert len(listed) == 1 and listed[0].startswith(
        f"tofiles  on clicks  ACTIVE  to file://{out}  from TRIM_HORIZON  freshness 1 s  BYTES  (made "), listed
    assert [c["name"] for c in json.loads(cli.ok(cli.sms_cmd(d, "channel", "list", "--stream", "clicks",
                                                             "--json")))] == ["tofiles"]
    cli.ok(cli.sms_cmd(d, "stream", "create", "other"))
    assert cli.ok(cli.sms_cmd(d, "channel", "list", "--stream", "other")).strip() == "no channels"

    # update; a bad one changes nothing
    _refused(d, "InvalidArgument", "update", "tofiles", "--freshness", "0")
    assert _channels(d)[0]["data_freshness_s"] == 1
    updated = json.loads(cli.ok(cli.sms_cmd(d, "channel", "update", "tofiles", "--freshness", "5", "--json")))
    assert (updated["data_freshness_s"], updated["uid"]) == (5, made["uid"])
    assert "channel updated: tofiles  on clicks" in cli.ok(cli.sms_cmd(d, "channel", "update", "tofiles",
                                                                        "--freshness", "5"))
    assert "freshness 5 s" in cli.ok(cli.sms_cmd(d, "channel", "describe", "tofiles"))

    # status: a line for the channel
    status = cli.ok(cli.sms_cmd(d, "status")).splitlines()
    [line] = [s for s in status if s.startswith("channel ")]
    assert line.startswith(f"channel tofiles  on clicks  to file://{out}  records {RECORDS}  worst lag "), line
    shown = json.loads(cli.ok(cli.sms_cmd(d, "status", "--json")))["channels"]
    assert [(c["name"], c["stream"], c["destination"], c["records"], c["errors"]) for c in shown] == [
        ("tofiles", "clicks", f"file://{out}", RECORDS, {})]

    # delete: gone, and what it delivered stays
    files = sorted(glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True))
    assert "channel tofiles deleted" in cli.ok(cli.sms_cmd(d, "channel", "delete", "tofiles"))
    _refused(d, "ChannelNotFound", "describe", "tofiles")
    assert cli.ok(cli.sms_cmd(d, "channel", "list")).strip() == "no channels"
    assert not [s for s in cli.ok(cli.sms_cmd(d, "status")).splitlines() if s.startswith("channel ")]
    assert sorted(glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True)) == files
