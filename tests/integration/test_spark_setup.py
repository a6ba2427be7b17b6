"""Spark as a user sets it up, not as the suite's `spark_session` does (issue 35 item 6): a
SparkSession of their own, from the virtual environment's interpreter, with no
$PYSPARK_PYTHON and a PATH whose `python3` is Debian's (no pyspark, no spark_sps).

- `register(spark)` gives the Python workers the driver's interpreter: `spark.read.format("sms")`
  reads a real TLS cluster's stream (it failed with ModuleNotFoundError in a Py4J trace).
- A bad option shows as one line (Spark's SQLSTATE line after it), not a Python traceback,
  and naming the option; the worker's next error still shows its traceback.
- A $PYSPARK_PYTHON that cannot import spark_sps is refused by register() in one line that
  says what to set.

One separate process (its own JVM), as a user's script is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

import sms  # noqa: E402
from tests.conftest import stream_name  # noqa: E402

pytestmark = pytest.mark.integration

SCRIPT_TIMEOUT_S = 300
SYSTEM_PYTHON = "/usr/bin/python3"

SCRIPT = r'''
import json, os, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1").getOrCreate())
from spark_sps.datasource import SparkSetupError, register, worker_python
address, stream = sys.argv[1], sys.argv[2]
out = {"default_exec": spark.sparkContext.pythonExec}
register(spark)
out["exec"] = spark.sparkContext.pythonExec
out["count"] = spark.read.format("sms").option("address", address).option("stream", stream).load().count()
errors = []
for name, value in (("startingOffsets", "earliest"), ("maxRecordsPerTrigger", "5"), ("bogus", "1")):
    try:
        spark.read.format("sms").option("address", address).option("stream", stream).option(name, value).load().count()
    except Exception as e:
        errors.append(str(e))
out["option_errors"] = errors
try:           # (not an option error: the worker still shows its traceback)
    spark.read.format("sms").option("address", address).option("stream", "no-such-stream-here").load().count()
except Exception as e:
    out["other_error"] = str(e)
os.environ["PYSPARK_PYTHON"] = sys.argv[3]         # a chosen interpreter without the package
spark.sparkContext.pythonExec = sys.argv[3]
try:
    worker_python(spark.sparkContext)
except SparkSetupError as e:
    out["setup_error"] = str(e)
spark.stop()
print("RESULT " + json.dumps(out))
'''


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"needs {SYSTEM_PYTHON} (Debian's python3)")
def test_a_users_own_session_reads_and_errors_are_one_line(cluster, tmp_path):
    stream = stream_name("spark-setup")
    with sms.Client(cluster.address) as client:
        client.create_stream(stream, partitions=2, replication_factor=1)
        client.put_records(stream, [(f"k{i}", b"v") for i in range(50)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = "/usr/bin:/bin"                      # python3 there is Debian's, without pyspark
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), cluster.address, stream, SYSTEM_PYTHON], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["default_exec"] == "python3" and out["exec"] == sys.executable
    assert out["count"] == 50
    kafka, other_mode, unknown = out["option_errors"]
    for text in out["option_errors"]:
        first, *rest = text.splitlines()
        assert "Traceback" not in text and [r.strip() for r in rest] == ["SQLSTATE: 38000"], text
        assert "OptionError: " in first
    assert "option 'startingOffsets' is Kafka's; the sms data source takes startingPosition" in kafka
    assert "option 'maxRecordsPerTrigger' applies to spark.readStream.format('sms') only" in other_mode
    assert "unknown option 'bogus' for spark.read.format('sms'); valid options: address, stream" in unknown
    assert "Traceback" in out["other_error"] and "StreamNotFound" in out["other_error"]
    assert out["setup_error"] == (f"Spark's Python workers run {SYSTEM_PYTHON} ($PYSPARK_PYTHON), which cannot "
                                  f"import spark_sps and pyspark: set PYSPARK_PYTHON={sys.executable} before the "
                                  "SparkSession starts")
