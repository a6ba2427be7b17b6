# The two commands of the README, and a few more.
.PHONY: demo up test test-full test-fast bench bench-full proto clean

demo:            ## start a local 3-node cluster, put and read records, check, stop
	@scripts/bootstrap.sh
	.venv/bin/sms demo

up:              ## run a local cluster in the foreground (Ctrl-C stops it)
	@scripts/bootstrap.sh
	.venv/bin/sms up

test:            ## install test dependencies (pip with PySpark, Debian's zookeeper and a JRE) and run the whole suite
	@scripts/system-deps.sh
	@scripts/bootstrap.sh test,spark
	.venv/bin/python -m pytest -q -m "not sweep"
	@echo "== again on the pure-Python wire codec (SMS_PURE_PYTHON=1): unit tests and two integration modules"
	SMS_PURE_PYTHON=1 .venv/bin/python -m pytest -q tests/unit tests/integration/test_headers.py tests/integration/test_dedup.py
	@echo "== the install without a compiler"
	scripts/check-no-compiler.sh

test-full:       ## the whole suite, every fault-trial sweep included (about 10 minutes more)
	@scripts/system-deps.sh
	@scripts/bootstrap.sh test,spark
	.venv/bin/python -m pytest -q

test-fast:       ## the suite without tests marked slow
	@scripts/system-deps.sh
	@scripts/bootstrap.sh test,spark
	.venv/bin/python -m pytest -q -m "not slow"

bench:           ## the quick benchmark set (< 3 min): JSON on stdout and in bench/results/, charts, targets met or missed
	@scripts/bench-deps.sh
	@scripts/bootstrap.sh bench
	.venv/bin/python -m bench.run --quick

bench-full:      ## every sweep of issue 7 (tens of minutes)
	@scripts/bench-deps.sh
	@scripts/bootstrap.sh bench
	.venv/bin/python -m bench.run --full

proto:           ## regenerate sms/proto/*_pb2*.py
	@scripts/bootstrap.sh test
	.venv/bin/python scripts/gen_proto.py

clean:
	rm -rf .venv sms-data .pytest_cache .hypothesis
