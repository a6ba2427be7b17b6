"""The Kinesis endpoint with the real AWS CLI (`awscli` from PyPI), as a user runs it: a
profile in its own config files (made by the test), `--endpoint-url`, and the cluster's CA
as the CLI's CA bundle. create, put-record, get-shard-iterator, get-records, list-shards,
split-shard, delete."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys

import pytest

from sms import security
from tests.conftest import stream_name

pytestmark = pytest.mark.integration

AWS = os.path.join(os.path.dirname(sys.executable), "aws")


@pytest.fixture(scope="module")
def aws(cluster, tmp_path_factory):
    if not os.path.exists(AWS) and shutil.which("aws") is None:
        pytest.skip("the AWS CLI is not installed (pip install -e '.[test]')")
    home = tmp_path_factory.mktemp("aws")
    key_id, secret = security.aws_credentials(cluster.admin_token)
    (home / "credentials").write_text(f"[sms]\naws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n")
    (home / "config").write_text(f"[profile sms]\nregion = eu-west-1\nca_bundle = {cluster.ca_file}\n"
                                 f"cli_pager =\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(home / "credentials"), AWS_CONFIG_FILE=str(home / "config"),
               AWS_PROFILE="sms")

    def run(*args: str) -> dict:
        done = subprocess.run([AWS if os.path.exists(AWS) else "aws", "kinesis", "--endpoint-url",
                               cluster.kinesis_endpoint, "--output", "json", *args],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"aws kinesis {' '.join(args)}: {done.stderr}"
        return json.loads(done.stdout) if done.stdout.strip() else {}
    return run


def test_the_aws_cli_runs_a_stream_s_life(aws):
    name = stream_name("cli-life")
    aws("create-stream", "--stream-name", name, "--shard-count", "1")
    aws("wait", "stream-exists", "--stream-name", name)
    put = aws("put-record", "--stream-name", name, "--partition-key", "k1",
              "--data", "from the cli")        # (AWS CLI v1 sends a blob argument's text as its bytes)
    assert put["ShardId"] == "shardId-000000000000" and int(put["SequenceNumber"]) > 0
    iterator = aws("get-shard-iterator", "--stream-name", name, "--shard-id", "shardId-000000000000",
                   "--shard-iterator-type", "TRIM_HORIZON")["ShardIterator"]
    records = aws("get-records", "--shard-iterator", iterator)["Records"]
    assert [base64.b64decode(r["Data"]) for r in records] == [b"from the cli"]
    assert records[0]["SequenceNumber"] == put["SequenceNumber"]
    aws("split-shard", "--stream-name", name, "--shard-to-split", "shardId-000000000000",
        "--new-starting-hash-key", str(2 ** 127))
    shards = aws("list-shards", "--stream-name", name)["Shards"]
    assert [s["ShardId"] for s in shards] == [f"shardId-{i:012d}" for i in range(3)]
    summary = aws("describe-stream-summary", "--stream-name", name)["StreamDescriptionSummary"]
    assert summary["StreamARN"].startswith("arn:aws:kinesis:eu-west-1:")        # the profile's region
    aws("delete-stream", "--stream-name", name)
    aws("wait", "stream-not-exists", "--stream-name", name)


def test_sms_key_aws_prints_what_the_aws_cli_and_boto3_need(cluster):
    """`eval "$(sms key aws)"` as the README has it: the exports it prints are all the AWS
    CLI and boto3 need, the endpoint included (the rest of its output is a comment)."""
    if not os.path.exists(AWS):
        pytest.skip("the AWS CLI is not installed (pip install -e '.[test]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "SMS_TOKEN"}
    env["HOME"] = str(cluster.data_dir)          # (no profile of the machine's user in the way)
    name = stream_name("cli-env")
    script = (f'eval "$({sys.executable} -m node key aws --data-dir {cluster.data_dir})" && '
              f'{AWS} kinesis create-stream --stream-name {name} --shard-count 1 && '
              f'{AWS} kinesis wait stream-exists --stream-name {name} && '
              f'{sys.executable} -c "import boto3; k = boto3.client(\'kinesis\'); '
              f'k.put_record(StreamName=\'{name}\', PartitionKey=\'k\', Data=b\'v\'); '
              f'print(k.describe_stream_summary(StreamName=\'{name}\')[\'StreamDescriptionSummary\'][\'StreamStatus\'])"'
              f' && {AWS} kinesis list-streams --output json')
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status, listing = done.stdout.split("\n", 1)
    assert status == "ACTIVE" and name in json.loads(listing)["StreamNames"]
