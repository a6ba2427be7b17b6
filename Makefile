# The two commands of the README, and a few more.
.PHONY: demo up test test-full test-fast bench bench-full proto clean

demo:            ## start a local 3-node cluster, put and read records, check, stop
	@scripts/bootstrap.sh
	.venv/bin/sms demo

up:              ## run a local cluster in the foreground (Ctrl-C stops it)
	@scripts/bootstrap.sh
	.venv/bin/sms up

# The suite runs on pytest-xdist with two workers: most tests wait on processes, so two keep
# the two cores busy (three were no faster here, and overloaded the fault trials); whole modules go to one worker (--dist loadfile), so module-scoped
# clusters are shared as before; the slowest modules start first (tests/conftest.py).
# SMS_SUITE_BUDGET_S fails a run that takes longer, printing its slowest tests
# (docs/testing.md).
TEST_WORKERS ?= 2
SUITE_BUDGET_S ?= 1140
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile
# what the pure-Python wire codec runs again: the modules that build, read or check batches
CODEC_TESTS = tests/unit/test_wire.py tests/unit/test_wire_differential.py tests/unit/test_wire_fuzz.py \
	tests/unit/test_wire_check_records.py tests/unit/test_record_batch.py tests/unit/test_accumulator.py \
	tests/unit/test_producer.py tests/unit/test_dedup.py tests/unit/test_dedup_runs.py tests/unit/test_link.py \
	tests/unit/test_log_store.py tests/unit/test_replica.py tests/unit/test_peerlink_wire.py \
	tests/unit/test_archive_fragment.py tests/unit/test_payloads.py tests/unit/test_encryption.py \
	tests/unit/test_read_budget.py tests/unit/test_retention.py \
	tests/integration/test_headers.py tests/integration/test_dedup.py

test:            ## install test dependencies (pip with PySpark, Debian's zookeeper and a JRE) and run the whole suite
	@scripts/system-deps.sh
	@scripts/node-deps.sh
	@scripts/bootstrap.sh test,spark
	SMS_SUITE_BUDGET_S=$(SUITE_BUDGET_S) .venv/bin/python -m pytest -q -m "not sweep" $(PYTEST_PARALLEL)
	@echo "== again on the pure-Python wire codec (SMS_PURE_PYTHON=1): the modules that touch batches"
	SMS_PURE_PYTHON=1 .venv/bin/python -m pytest -q -n 2 $(CODEC_TESTS)
	@echo "== the install without a compiler"
	scripts/check-no-compiler.sh

test-full:       ## the whole suite, every fault-trial sweep included (about 10 minutes more)
	@scripts/system-deps.sh
	@scripts/node-deps.sh
	@scripts/bootstrap.sh test,spark
	.venv/bin/python -m pytest -q $(PYTEST_PARALLEL)

test-fast:       ## the suite without tests marked slow
	@scripts/system-deps.sh
	@scripts/node-deps.sh
	@scripts/bootstrap.sh test,spark
	.venv/bin/python -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

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
