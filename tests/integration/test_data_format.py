"""A storage node's data directory format (storage/dataformat.py), on real nodes and
real LMDB: a directory written by the previous format (no FORMAT marker) is upgraded in
place and its records read back; a directory of a newer format is refused at start with
DataFormatTooNew, one line, and left untouched."""

from __future__ import annotations

import json
import os

import pytest

import sms
from node.launcher import LocalCluster
from storage import dataformat

pytestmark = pytest.mark.integration

RECORDS = 50


def fill(cluster: LocalCluster) -> list[tuple[str, bytes]]:
    sent = [(f"k{i}", f"v{i}".encode()) for i in range(RECORDS)]
    with sms.Client(cluster.address, **cluster.client_options()) as client:
        client.create_stream("kept", partitions=2, replication_factor=1)
        client.put_records("kept", sent)
    return sent


def test_the_previous_format_is_upgraded_and_read_back(tmp_path):
    root = str(tmp_path / "c")
    with LocalCluster(root, nodes=1) as cluster:
        sent = fill(cluster)
    storage_dir = os.path.join(root, "n1", "storage")
    assert dataformat.read(storage_dir) == dataformat.CURRENT
    os.unlink(os.path.join(storage_dir, dataformat.FILE))      # as releases before the marker left it
    assert dataformat.read(storage_dir) == 1
    with LocalCluster(root, nodes=1) as cluster:
        with sms.Client(cluster.address, **cluster.client_options()) as client:
            got = sorted((r.partition_key, r.data) for r in client.read_stream("kept"))
    assert got == sorted(sent)
    with open(os.path.join(storage_dir, dataformat.FILE)) as f:
        assert json.load(f)["format"] == dataformat.CURRENT
    with open(os.path.join(root, "logs", "n1.log")) as f:
        text = f.read()
    assert f"from format 1 to {dataformat.CURRENT}" in text


def test_a_newer_format_is_refused_untouched(tmp_path):
    root = str(tmp_path / "c")
    with LocalCluster(root, nodes=1) as cluster:
        fill(cluster)
    storage_dir = os.path.join(root, "n1", "storage")
    with open(os.path.join(storage_dir, dataformat.FILE), "w") as f:
        json.dump({"format": dataformat.CURRENT + 1, "written_by": "a later release"}, f)
    before = {name: os.stat(os.path.join(storage_dir, name, "data.mdb")).st_mtime_ns
              for name in os.listdir(storage_dir) if name.endswith(".lmdb")}
    assert before
    cluster = LocalCluster(root, nodes=1)
    with pytest.raises(RuntimeError) as e:
        cluster.start()
    assert "node n1 exited" in str(e.value)
    with open(os.path.join(root, "logs", "n1.out")) as f:
        lines = [line for line in f.read().splitlines() if "DataFormat" in line]
    assert len(lines) == 1 and lines[0].startswith("sms serve: DataFormatTooNew: ") and \
        f"in data format {dataformat.CURRENT + 1}" in lines[0], lines
    assert {name: os.stat(os.path.join(storage_dir, name, "data.mdb")).st_mtime_ns for name in before} == before
    with open(os.path.join(storage_dir, dataformat.FILE)) as f:
        assert json.load(f)["format"] == dataformat.CURRENT + 1


def test_a_new_directory_gets_the_current_format_and_a_bad_marker_is_named(tmp_path):
    d = str(tmp_path / "new")
    assert dataformat.open_dir(d) == dataformat.CURRENT
    assert dataformat.read(d) == dataformat.CURRENT
    with open(os.path.join(d, dataformat.FILE), "w") as f:
        f.write("{not json")
    with pytest.raises(dataformat.DataFormatError, match="cannot be read"):
        dataformat.open_dir(d)
