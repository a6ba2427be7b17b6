"""node/config.py: the TOML file, the environment and flags over the defaults of
sms/limits.py, each value checked with a message naming it, its value and its source."""

from __future__ import annotations

import pytest

from node import config
from sms import limits


@pytest.fixture
def restore_limits():
    saved = {name: getattr(limits, name) for name in dir(limits) if name.isupper()}
    yield
    for name, value in saved.items():
        setattr(limits, name, value)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "sms.toml"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_limits():
    values = config.load("", env={})
    assert all(v.source == "default" for v in values.values())
    for s in config.SETTINGS:
        if s.limit:
            assert getattr(limits, s.limit) == s.default == values[s.key].value, s.key
            assert (s.lo is None or s.lo <= s.default) and (s.hi is None or s.default <= s.hi), s.key


def test_file_then_environment_then_flags(tmp_path):
    path = write(tmp_path, """
[storage]
size_cap_bytes = 1_073_741_824
[timeouts]
append_s = 20
[node]
listen = "127.0.0.1:7401"
metrics_listen = "127.0.0.1:9401"
[log]
format = "JSON"
""")
    env = {"SMS_TIMEOUTS_APPEND_S": "15.5", "SMS_LOG_LEVEL": "debug"}
    values = config.load(path, env=env, flags={"node.listen": ("--listen", "127.0.0.1:7500"),
                                               "node.metrics_listen": ("--metrics-listen", None)})
    assert (values["storage.size_cap_bytes"].value, values["storage.size_cap_bytes"].source) == (1 << 30, path)
    assert (values["timeouts.append_s"].value, values["timeouts.append_s"].source) == (15.5, "$SMS_TIMEOUTS_APPEND_S")
    assert (values["node.listen"].value, values["node.listen"].source) == ("127.0.0.1:7500", "--listen")
    assert (values["node.metrics_listen"].value, values["node.metrics_listen"].source) == ("127.0.0.1:9401", path)
    assert (values["log.format"].value, values["log.level"].value) == ("json", "DEBUG")
    assert values["log.level"].source == "$SMS_LOG_LEVEL"       # (node/logs.py's own variable)
    assert values["timeouts.rpc_s"].source == "default"


def test_the_config_file_may_come_from_the_environment(tmp_path):
    path = write(tmp_path, "[metastore]\nsession_ttl_s = 6\n")
    values = config.load(None, env={"SMS_CONFIG": path})
    assert values["metastore.session_ttl_s"].value == 6.0
    # what follows from the session TTL unless set
    assert values["timeouts.metadata_read_s"].value == 6.0
    assert values["timeouts.metadata_read_s"].source == f"metastore.session_ttl_s ({path})"


@pytest.mark.parametrize("text, named", [
    ("[storage]\nsize_cap = 1\n", "unknown setting storage.size_cap; [storage] has storage.group_commit_batches_max"),
    ("[disk]\nx = 1\n", "unknown setting disk.x; sections: "),
    ("storage = 1\n", "'storage' is not a [section]"),
    ("[storage]\nsize_cap_bytes = \"big\"\n", "storage.size_cap_bytes = 'big' (from PATH): expected an integer"),
    ("[storage]\nsize_cap_bytes = 1024\n", "storage.size_cap_bytes = 1024 (from PATH): expected 67108864.."),
    ("[timeouts]\nappend_s = true\n", "timeouts.append_s = True (from PATH): expected float"),
    ("[log]\nformat = \"xml\"\n", "log.format = 'xml' (from PATH): expected one of text, json"),
    ("[node]\nlisten = \"7401\"\n", "node.listen = '7401' (from PATH): expected HOST:PORT"),
    ("[storage\n", "PATH: not valid TOML"),
])
def test_a_bad_file_is_named(tmp_path, text, named):
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    assert named.replace("PATH", path) in str(e.value)


def test_a_bad_environment_value_is_named():
    with pytest.raises(config.ConfigError, match=r"timeouts.rpc_s = 'soon' \(from \$SMS_TIMEOUTS_RPC_S\): "
                                                 r"expected a number"):
        config.load("", env={"SMS_TIMEOUTS_RPC_S": "soon"})
    with pytest.raises(config.ConfigError, match=r"metastore.session_ttl_s = '0.5' .*expected 1.5..60"):
        config.load("", env={"SMS_METASTORE_SESSION_TTL_S": "0.5"})


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read the configuration .*nope.toml"):
        config.load(str(tmp_path / "nope.toml"), env={})


def test_apply_sets_the_limits_and_the_log_environment(tmp_path, restore_limits, monkeypatch):
    for name in ("SMS_LOG_LEVEL", "SMS_LOG_FORMAT", "SMS_LOG_FILE"):
        # (set first, so that the undo removes what config.apply sets: a delenv of a name
        # that is not set restores nothing, and the value leaked into later tests)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    path = write(tmp_path, "[metastore]\nsession_ttl_s = 4.5\n[storage]\nsize_cap_bytes = 134217728\n"
                           "[log]\nformat = \"json\"\n")
    config.apply(config.load(path, env={}))
    assert limits.LMDB_MAP_BYTES == 134217728
    assert limits.METASTORE_SESSION_TTL_S == 4.5 and limits.METADATA_READ_WAIT_S == 4.5
    assert limits.CLIENT_LEADER_WAIT_S == 18.0
    import os
    assert os.environ["SMS_LOG_FORMAT"] == "json" and "SMS_LOG_LEVEL" not in os.environ


def test_show_lists_every_setting_with_its_source(tmp_path):
    path = write(tmp_path, "[timeouts]\nrpc_s = 12\n")
    shown = {row["key"]: row for row in config.show(config.load(path, env={}))}
    assert set(shown) == set(config.BY_KEY)
    assert shown["timeouts.rpc_s"] | {} == {"key": "timeouts.rpc_s", "value": 12.0, "source": path,
                                           "env": "SMS_TIMEOUTS_RPC_S", "limit": "RPC_TIMEOUT_S",
                                           "help": config.BY_KEY["timeouts.rpc_s"].help}


def test_link_liveness_settings_must_agree():
    values = config.load(env={"SMS_REPLICATION_LINK_ACK_TIMEOUT_S": "2.0", "SMS_REPLICATION_LINK_KEEPALIVE_INTERVAL_S": "0.5"})
    assert values["replication.link_ack_timeout_s"].value == 2.0
    with pytest.raises(config.ConfigError, match=r"link_keepalive_interval_s = 0.5 .* less than half "
                                                 r"replication.link_ack_timeout_s = 0.8"):
        config.load(env={"SMS_REPLICATION_LINK_ACK_TIMEOUT_S": "0.8", "SMS_REPLICATION_LINK_KEEPALIVE_INTERVAL_S": "0.5"})


def test_a_configuration_that_breaks_how_limits_relate_is_refused(tmp_path, restore_limits):
    """The setting is within its own range, but with the others it breaks a relation of
    sms/limits.py (the archive's cache must hold the fragments a read prefetches): named,
    not run."""
    path = write(tmp_path, "[archive]\ncache_bytes_max = 16777216\n")
    with pytest.raises(config.ConfigError, match=r"breaks how limits must relate .*ARCHIVE_CACHE_BYTES_MAX >="):
        config.apply(config.load(path, env={}))
    assert limits.broken() == ["ARCHIVE_CACHE_BYTES_MAX >= (ARCHIVE_PREFETCH_FRAGMENTS + 2) * 2 * "
                               "ARCHIVE_FRAGMENT_RAW_BYTES_TARGET"]


def test_every_relation_of_the_limits_holds_as_shipped():
    assert len(limits.RELATIONS) >= 30 and limits.broken() == []


def test_the_kinesis_endpoint_may_be_off_in_a_file(tmp_path):
    """As its help says (a file, like --kinesis-listen, may turn the endpoint off); any other
    value that is not HOST:PORT stays refused by name."""
    values = config.load(write(tmp_path, '[node]\nkinesis_listen = "off"\n'), env={})
    assert values["node.kinesis_listen"].value == "off"
    with pytest.raises(config.ConfigError, match="node.kinesis_listen.*expected HOST:PORT"):
        config.load(write(tmp_path, '[node]\nkinesis_listen = "nowhere"\n'), env={})
    with pytest.raises(config.ConfigError, match="node.metrics_listen.*expected HOST:PORT"):
        config.load(write(tmp_path, '[node]\nmetrics_listen = "off"\n'), env={})
