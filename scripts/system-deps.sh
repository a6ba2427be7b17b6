#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when missing: ZooKeeper (the
# tests start a real server from /usr/share/java/zookeeper.jar), a Java runtime, and
# FUSE 3 (fusermount3 and the libfuse3 library that the `mfusepy` package loads: the
# failing disk of tests/integration/test_fsync_failure.py), and iptables and iproute2
# (tests/netfault/ builds test hosts of network namespaces and cuts them with iptables;
# those trials run as root only), and Chromium with its driver (the web console's
# browser tests drive a real headless Chromium; they skip without it), and Prometheus
# (Debian's `prometheus`, with promtool: tests/integration/test_prometheus.py runs
# /usr/bin/prometheus itself against a cluster; the package's own service is stopped
# and disabled after the install, where systemd runs and had started it).
# Needs root (or sudo) and apt-get; elsewhere it says what to install and goes on,
# and the ZooKeeper (and FUSE) tests skip with a message.
set -euo pipefail
need=()
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ -x /usr/bin/prometheus ] || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
. "$(dirname "$0")/apt-install.sh"
apt_install system-deps "ZooKeeper tests will skip" 1 "${need[@]}"
# the tests start their own Prometheus: none left running as a service of the package
if [[ " ${need[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
