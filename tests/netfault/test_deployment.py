"""docs/deployment.md, run as written: three hosts and a client made of network namespaces
(tests/netfault/hosts.py), each command block of the guide run by bash in the namespace
its first line names (`# on each host`, `# on h1`, `# on the client`; `# every shell`
blocks start every shell). The only changes to the text: the example addresses
10.0.0.N become the hosts' ones, each host's /etc/sms, /etc/zookeeper/conf,
/var/lib/sms and /var/lib/zookeeper a directory of its own under tmp_path (they share
one file system), and /opt/sms/bin this venv's bin. The guide's install block is not
run (this machine has the packages).

Two stand-ins on PATH play the machines' part: `systemctl` runs a unit of
deploy/systemd/ (its ExecStart, with its EnvironmentFile and Environment, StateDirectory
and UMask; not User= nor the sandboxing, nor the Limit*s, which need privileges this
machine lacks) in the background in the host's namespace, and stops it as systemd does
(KillSignal, then SIGKILL after TimeoutStopSec); `scp` copies into the tree of the host
the address names. So ZooKeeper runs from Debian's zkServer.sh, and each SMS process
from `sms serve --config /etc/sms/NAME.toml`, as the units say.

The guide's story: a CA and certificates by host address, the first admin key from
`sms admin bootstrap`, a ZooKeeper ensemble of three, a control process and a storage
node on each host, a stream of RF 3, 1000 records in and out from the client; then h3
stops (ZooKeeper, control and storage node), `sms status` shows it gone and the cluster
short of replicas, 1000 more records go in, and all 2000 come back, none lost, none twice;
h3 starts again and the chains are whole again. It runs twice: with h3 stopped as the
guide says, and with h3's plug pulled (SIGKILL to everything in its namespace).

Beside it: the guide's blocks are all marked, `systemd-analyze verify` passes on the
units, and deploy/container/Containerfile builds and runs a node (marked slow; it skips,
saying why, where podman cannot build or run containers or has no base image).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.netfault import hosts as hostlib
from tests.zkserver import zk_available
from tests.zkserver import skip_reason as zk_skip_reason

ROOT_DIR = Path(__file__).resolve().parents[2]
GUIDE = ROOT_DIR / "docs" / "deployment.md"
UNITS = ROOT_DIR / "deploy" / "systemd"
VENV_BIN = Path(sys.executable).parent
ZK_SERVER_SH = Path("/usr/share/zookeeper/bin/zkServer.sh")
HOSTS = ("h1", "h2", "h3")
CLIENT = "client"
EXAMPLE_ADDRESSES = {"h1": "10.0.0.1", "h2": "10.0.0.2", "h3": "10.0.0.3"}
HOST_PATHS = ("/etc/sms", "/etc/zookeeper/conf", "/var/lib/sms", "/var/lib/zookeeper")
THIS_HOST_LINE = "export N=1 ME=$H1"          # the guide's per-host line, as written for h1
BLOCK_TIMEOUT_S = 240.0                       # one block (its own waits have deadlines below this)

# the markers a block's first line may have, and where it runs
MARKERS = {"# install, on each host (as root)": "install", "# every shell": "every",
           "# every shell on the client": "every-client", "# on each host": "hosts",
           "# on h1": "h1", "# on h2": "h2", "# on h3": "h3", "# on the client": CLIENT}


def _reason() -> str | None:
    reason = hostlib.unavailable_reason()
    if reason:
        return reason
    if not zk_available() or not ZK_SERVER_SH.is_file():
        return zk_skip_reason() + f" ({ZK_SERVER_SH})"
    for tool in ("openssl", "bash", "timeout"):
        if shutil.which(tool) is None:
            return f"the guide uses `{tool}`"
    if not (VENV_BIN / "sms").is_file():
        return f"no `sms` next to {sys.executable}: install the project (pip install -e .)"
    return None


REASON = _reason()
pytestmark = [pytest.mark.integration]


@dataclass(frozen=True)
class Block:
    where: str          # a MARKERS value
    text: str           # the block, its marker line included
    line: int           # its first line in the guide


def guide_blocks(text: str) -> list[Block]:
    """Every ```sh block of the guide, with where it runs; ValueError for one without a
    known marker (the guide and this test would have drifted apart)."""
    blocks = []
    for found in re.finditer(r"^```sh\n(.*?)^```$", text, re.M | re.S):
        body = found.group(1)
        marker = body.splitlines()[0].strip() if body.strip() else ""
        line = text.count("\n", 0, found.start()) + 1
        if marker not in MARKERS:
            raise ValueError(f"docs/deployment.md:{line}: a sh block must start with one of {sorted(MARKERS)}, "
                             f"not {marker!r}")
        blocks.append(Block(MARKERS[marker], body, line))
    return blocks


def localize(text: str, host: str, root: Path, addresses: dict[str, str]) -> str:
    """The guide's text as run on `host`: its addresses, its tree, this venv, its number."""
    for name, example in EXAMPLE_ADDRESSES.items():
        text = re.sub(re.escape(example) + r"(?!\d)", addresses[name], text)
    text = re.sub("|".join(re.escape(p) for p in HOST_PATHS), lambda m: f"{root}{m.group(0)}", text)
    text = text.replace("/opt/sms/bin/", f"{VENV_BIN}/")
    if host in HOSTS and host != "h1":
        n = HOSTS.index(host) + 1
        text = text.replace(THIS_HOST_LINE, f"export N={n} ME=$H{n}")
    return text


# --- the machines' stand-ins ------------------------------------------------------------
SYSTEMCTL = textwrap.dedent('''\
    #!{python}
    """systemctl, as far as docs/deployment.md uses it, for a host that is a network
    namespace: start runs a unit's ExecStart in the background, stop stops it."""
    import json, os, shlex, signal, subprocess, sys, time
    root, units = os.environ["SMS_TEST_ROOT"], os.environ["SMS_TEST_UNITS"]
    subst = json.loads(os.environ["SMS_TEST_SUBST"])
    run_dir = os.path.join(root, "run", "systemd")
    os.makedirs(run_dir, exist_ok=True)

    def local(text):
        for old, new in subst:
            text = text.replace(old, new)
        return text

    def unit(name):
        name = name if name.endswith(".service") else name + ".service"
        base, at, rest = name.partition("@")
        instance = rest[:-len(".service")] if at else ""
        path = os.path.join(units, f"{{base}}@.service" if at else name)
        service = {{}}
        section = ""
        for line in open(path):
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Service" and "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                value = value.replace("%i", instance).replace("%n", name).replace("%%", "%")
                service.setdefault(key, []).append(value)
        return name, service

    def environment(service):
        env = {{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}}
        for spec in service.get("EnvironmentFile", []):
            optional, path = spec.startswith("-"), local(spec.lstrip("-"))
            if optional and not os.path.exists(path):
                continue
            for line in open(path):
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, _, value = line.partition("=")
                    env[key.strip()] = value.strip().strip('"')
        for spec in service.get("Environment", []):
            for item in shlex.split(spec):
                key, _, value = item.partition("=")
                env[key] = value
        return env

    def alive(pid):
        try:
            return open(f"/proc/{{pid}}/stat").read().split(") ")[1][0] != "Z"
        except (OSError, IndexError):
            return False

    def start(name, service):
        pid_file = os.path.join(run_dir, name + ".pid")
        if os.path.exists(pid_file) and alive(int(open(pid_file).read())):
            return
        for state in service.get("StateDirectory", []):
            os.makedirs(local("/var/lib/" + state), mode=0o755, exist_ok=True)
        argv = [local(a) for a in shlex.split(service["ExecStart"][-1].lstrip("-@+!"))]
        umask = int(service.get("UMask", ["0022"])[-1], 8)
        log = open(os.path.join(root, "log", name + ".log"), "ab")
        proc = subprocess.Popen(argv, env=environment(service), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, cwd="/", start_new_session=True,
                                preexec_fn=lambda: os.umask(umask))
        open(pid_file, "w").write(str(proc.pid))

    def stop(name, service):
        pid_file = os.path.join(run_dir, name + ".pid")
        if not os.path.exists(pid_file):
            return
        pid = int(open(pid_file).read())
        sig = getattr(signal, service.get("KillSignal", ["SIGTERM"])[-1])
        deadline = time.monotonic() + float(service.get("TimeoutStopSec", ["90"])[-1])
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
        os.unlink(pid_file)

    args = [a for a in sys.argv[1:] if a != "--now"]
    command, names = args[0], args[1:]
    os.makedirs(os.path.join(root, "log"), exist_ok=True)
    if command == "daemon-reload":
        sys.exit(0)
    if command not in ("enable", "start", "stop"):
        sys.exit(f"systemctl stand-in: {{command}}: not done here")
    for name in names:
        (stop if command == "stop" else start)(*unit(name))
''')

SCP = textwrap.dedent('''\
    #!{python}
    """scp SOURCE... root@ADDRESS:DIR/ between the trees of test hosts."""
    import json, os, shutil, sys
    roots = json.loads(os.environ["SMS_TEST_HOSTS"])      # address -> that host's tree
    here = os.environ["SMS_TEST_ROOT"]
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    *sources, target = args
    address, _, path = target.split("@", 1)[-1].partition(":")
    path = roots[address] + path[len(here):] if path.startswith(here) else path
    for source in sources:
        shutil.copy(source, os.path.join(path, os.path.basename(source)) if os.path.isdir(path) else path)
''')


class Machines:
    """The four test machines: their trees, addresses, and a bash in each."""

    def __init__(self, bed: hostlib.Testbed, base: Path):
        self.bed = bed
        self.addresses = {name: bed[name].ip for name in (*HOSTS, CLIENT)}
        self.roots = {name: base / name for name in (*HOSTS, CLIENT)}
        self.shims = base / "bin"
        self.shims.mkdir(parents=True)
        for name, text in (("systemctl", SYSTEMCTL), ("scp", SCP)):
            path = self.shims / name
            path.write_text(text.format(python=sys.executable))
            path.chmod(0o755)
        for root in self.roots.values():           # what the install block leaves
            for p in HOST_PATHS:
                (root / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (root / "home").mkdir()
            (root / "log").mkdir()
        self.transcript: list[str] = []

    def env(self, name: str) -> dict[str, str]:
        root = self.roots[name]
        subst = [(p, f"{root}{p}") for p in HOST_PATHS] + [("/opt/sms/bin/", f"{VENV_BIN}/")]
        return {"PATH": f"{self.shims}:{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(root / "home"), "LANG": "C.UTF-8", "SMS_TEST_ROOT": str(root),
                "SMS_TEST_UNITS": str(UNITS), "SMS_TEST_SUBST": json.dumps(subst),
                "SMS_TEST_HOSTS": json.dumps({self.addresses[n]: str(self.roots[n]) for n in HOSTS})}

    def run(self, name: str, script: str, timeout_s: float = BLOCK_TIMEOUT_S) -> str:
        """`script` (already localized) by bash -euo pipefail on machine `name`: its stdout."""
        argv = self.bed[name].command(["bash", "-euo", "pipefail", "-c", script])
        t0 = time.monotonic()
        try:
            done = subprocess.run(argv, env=self.env(name), cwd=self.roots[name] / "home", capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"on {name}, timed out after {timeout_s}s:\n{script}\n"
                                 f"stdout: {e.stdout}\nstderr: {e.stderr}\n{self.logs()}") from None
        self.transcript.append(f"--- on {name} ({time.monotonic() - t0:.1f}s):\n{script}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise AssertionError(f"on {name}, exit {done.returncode}:\n{script}\nstdout: {done.stdout}\n"
                                 f"stderr: {done.stderr}\n{self.logs()}")
        return done.stdout

    def logs(self, lines: int = 25) -> str:
        out = []
        for name in HOSTS:
            for log in sorted((self.roots[name] / "log").glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"=== {name} {log.name}:\n" + "\n".join(tail))
        return "\n".join(out)


def _read_all(machines: Machines, prefix: str) -> list[str]:
    """Every record's data of the stream `events`, read on the client."""
    out = machines.run(CLIENT, prefix + "sms read events --json\n")
    return [json.loads(line)["data"] for line in out.splitlines() if line.strip()]


# --- the tests ----------------------------------------------------------------------------
def test_the_guide_marks_every_block():
    """Each sh block says where it runs; the guide has each step the deployment test runs."""
    blocks = guide_blocks(GUIDE.read_text())
    wheres = [b.where for b in blocks]
    assert wheres.count("install") == 1 and wheres.count("every") == 1 and wheres.count("every-client") == 1
    assert {"hosts", "h1", "h3", CLIENT} <= set(wheres)
    text = "\n".join(b.text for b in blocks)
    for step in ("sms certs init", "sms certs issue", "sms admin bootstrap", "systemctl enable --now sms-zookeeper",
                 "systemctl enable --now sms@control sms@storage", "sms stream create", "sms put", "sms read",
                 "systemctl stop"):
        assert step in text, step
    assert THIS_HOST_LINE in next(b.text for b in blocks if b.where == "every")


def test_the_units_verify(tmp_path):
    """`systemd-analyze verify` on the units (ExecStart pointed at this venv's sms, which
    it requires to exist)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    paths = []
    for unit in ("sms@.service", "sms-zookeeper.service"):
        text = (UNITS / unit).read_text().replace("/opt/sms/bin/", f"{VENV_BIN}/")
        path = tmp_path / unit.replace("@.", "@storage.")
        path.write_text(text)
        paths.append(str(path))
    done = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # (it also warns about what this machine lacks, e.g. no systemd running: only its
    # complaints about the units themselves fail the test)
    assert not [line for line in done.stderr.splitlines() if "sms" in line and "service" in line], done.stderr


def _power_off(host: hostlib.Host) -> None:
    """h3's plug pulled: SIGKILL to everything in its namespace."""
    for pid in host.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: not host.pids(), 10.0, f"every process of {host.name} gone")


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.parametrize("stop", ["as-written", pytest.param("power-off", marks=pytest.mark.sweep)])
def test_deployment_as_written(tmp_path, stop):
    """The guide's blocks in order; with `power-off`, h3's `systemctl stop` block is
    replaced by SIGKILL to every process of h3 (a crash, not a clean stop)."""
    t0 = time.monotonic()
    blocks = guide_blocks(GUIDE.read_text())
    with hostlib.Testbed([*HOSTS, CLIENT]) as bed:
        machines = Machines(bed, tmp_path)
        every = next(b.text for b in blocks if b.where == "every")
        every_client = next(b.text for b in blocks if b.where == "every-client")
        reads: list[str] = []
        statuses: list[str] = []
        stopped = False
        for block in blocks:
            if block.where in ("install", "every", "every-client"):
                continue
            if block.where == "h3" and "systemctl stop" in block.text:
                if stop == "power-off":
                    _power_off(bed["h3"])
                else:
                    machines.run("h3", localize(every + block.text, "h3", machines.roots["h3"], machines.addresses))
                assert not bed["h3"].pids(), f"h3 still runs {bed['h3'].pids()}"
                stopped = True
                continue
            targets = HOSTS if block.where == "hosts" else (block.where,)
            for name in targets:
                prefix = every + (every_client if name == CLIENT else "")
                script = localize(prefix + block.text, name, machines.roots[name], machines.addresses)
                out = machines.run(name, script)
                if name == CLIENT and "sms read events | wc -l" in block.text:
                    reads.append(out.split()[-1])
                if name == CLIENT and "sms status\n" in block.text:
                    statuses.append(out)
        transcript = "\n".join(machines.transcript)
        assert stopped, "the guide stops no host"
        assert reads == ["1000", "2000", "2000"], transcript

        # what the guide says of `sms status`: every node at first; after h3 stopped none of
        # its nodes, and every partition short of a replica; once it is back, all again
        first, down, back = statuses
        for node in ("c1", "c2", "c3", "n1", "n2", "n3"):
            assert re.search(rf"^node {node} ", first, re.M), first
            assert re.search(rf"^node {node} ", back, re.M), back
            assert (re.search(rf"^node {node} ", down, re.M) is None) == node.endswith("3"), down
        assert re.search(r"^under-replicated: 4 partitions", down, re.M), down
        assert re.search(r"^replication: every partition has its replication factor", back, re.M), back
        assert len(re.findall(r"chain n\d -> n\d -> n\d ", back)) == 4, back

        # nothing acknowledged is lost, nothing is there twice
        prefix = localize(every + every_client, CLIENT, machines.roots[CLIENT], machines.addresses)
        data = _read_all(machines, prefix)
        assert sorted(data) == sorted(f"event {i}" for i in range(1, 2001)), (len(data), len(set(data)))

        # h1's files are the samples of deploy/systemd/ (there, with the example addresses)
        h1 = machines.roots["h1"]
        for sample in ("control.toml", "storage.toml", "zookeeper.env"):
            expected = localize((UNITS / sample).read_text(), "h1", h1, machines.addresses)
            assert (h1 / "etc/sms" / sample).read_text() == expected, sample
        print(f"\ndeployment guide run in {time.monotonic() - t0:.1f}s ({stop})\n{transcript}")


# --- the container image ------------------------------------------------------------------
CONTAINERFILE = ROOT_DIR / "deploy" / "container" / "Containerfile"
IGNOREFILE = ROOT_DIR / "deploy" / "container" / ".containerignore"
LOCAL_BASE = "localhost/debian:bookworm"         # e.g. debootstrap's, imported (the Containerfile says how)
DEFAULT_BASE = "docker.io/library/debian:bookworm-slim"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CACHE_TAG = "localhost/sms-test-build:cache"
CONTAINER_UID = 10001
PODMAN_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = 900.0
NODE_START_S = 90.0
# where the default runtime cannot run containers here (crun: "cgroups in hybrid mode not
# supported"; raising RLIMIT_NOFILE/NPROC over the caller's is refused without
# CAP_SYS_RESOURCE), runc with limits no higher than this process's can
_FALLBACK_GLOBAL = ["--runtime", "runc"]


def _podman(*args: str, timeout_s: float = PODMAN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s)


def _podman_setup() -> tuple[list[str], list[str], list[str], str] | str:
    """(podman's global options, `run` options, `build` options, base image) that work on
    this machine, or why podman cannot build and run the image here."""
    if shutil.which("podman") is None:
        return "no podman here (apt-get install podman)"
    base = os.environ.get("SMS_CONTAINER_BASE", "")
    if not base:
        for candidate in (LOCAL_BASE, DEFAULT_BASE):
            if _podman("image", "exists", candidate).returncode == 0:
                base = candidate
                break
        else:
            pulled = _podman("pull", "-q", DEFAULT_BASE)
            if pulled.returncode != 0:
                return (f"no base image: {DEFAULT_BASE} cannot be pulled ({pulled.stderr.strip()[-200:]}), and there "
                        f"is no {LOCAL_BASE} (or $SMS_CONTAINER_BASE); deploy/container/Containerfile says how to make one")
            base = DEFAULT_BASE
    import resource
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1] - 1)
    tried = []
    for global_opts, run_opts, build_opts in (
            ([], [], []),
            (_FALLBACK_GLOBAL, ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"],
             ["--isolation=chroot"])):
        probe = _podman(*global_opts, "run", "--rm", *run_opts, base, "true")
        if probe.returncode == 0:
            return global_opts, run_opts, build_opts, base
        tried.append(f"podman {' '.join(global_opts + ['run'] + run_opts)}: {probe.stderr.strip()[-200:]}")
    return "podman cannot run a container here: " + "; ".join(tried)


def _dangling_images() -> set[str]:
    return set(_podman("images", "-q", "--no-trunc", "--filter", "dangling=true").stdout.split())


def _sms(*args: str, env: dict[str, str] | None = None, input_text: str | None = None) -> str:
    done = subprocess.run([str(VENV_BIN / "sms"), *args], capture_output=True, text=True, timeout=120,
                          input=input_text, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"sms {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.sweep                 # (make test-full: podman and a base image are rarely there; CI skips it)
def test_the_container_image_serves(tmp_path):
    """deploy/container/Containerfile built (on a base image this machine has, with its CA
    bundle for pip), then run as the guide's "Containers" section does: the host's
    network, /etc/sms and the data directory from the host, an --env-file; one TLS node
    with every role on an embedded metastore, reached by the `sms` of this venv."""
    setup = _podman_setup()
    if isinstance(setup, str):
        pytest.skip(setup)
    global_opts, run_opts, build_opts, base = setup
    tag = f"localhost/sms-test:{os.getpid()}"
    name = f"sms-test-{os.getpid()}"
    build = ["build", *build_opts, "-f", str(CONTAINERFILE), "--ignorefile", str(IGNOREFILE),
             "--build-arg", f"BASE={base}"]
    if HOST_CA_BUNDLE.is_file():      # (where a proxy re-signs TLS, pip in the build trusts what this host does)
        build += ["-v", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/host-ca.crt:ro",
                  "--build-arg", "PIP_CERT=/etc/ssl/certs/host-ca.crt"]
    dangling_before = _dangling_images()
    try:
        # the build stage tagged first (BUILD_CACHE_TAG): its layers, the dependencies' above
        # all, stay as the cache of the next run's build instead of going with this image
        for step in (["--target", "build", "-t", BUILD_CACHE_TAG], ["-t", tag]):
            built = _podman(*global_opts, *build, *step, str(ROOT_DIR), timeout_s=BUILD_TIMEOUT_S)
            assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        etc, data = tmp_path / "etc", tmp_path / "data"
        data.mkdir()
        _sms("certs", "init", "--dir", str(etc / "ca"))
        _sms("certs", "issue", "--ca-dir", str(etc / "ca"), "--node", "n1", "--host", "127.0.0.1", "--out", str(etc))
        _sms("admin", "bootstrap", "--token-file", str(etc / "admin.token"))
        from tests.zkserver import free_port
        port, cluster_port = free_port(), free_port()
        (etc / "sms.toml").write_text(textwrap.dedent(f"""\
            [metastore]
            url = "embedded:///var/lib/sms/meta.lmdb"
            [tls]
            ca_file = "/etc/sms/ca/ca.pem"
            cert_file = "/etc/sms/n1.pem"
            key_file = "/etc/sms/n1.key"
            [node]
            id = "n1"
            roles = "control,storage,ingestion,retrieval"
            data_dir = "/var/lib/sms/n1"
            listen = "127.0.0.1:{port}"
            cluster_listen = "127.0.0.1:{cluster_port}"
            metrics_listen = "127.0.0.1:0"
            bootstrap_token_file = "/etc/sms/admin.token"
            """))
        (etc / "sms.env").write_text("SMS_LOG_FORMAT=json\n")
        for path in (etc, data, *etc.rglob("*")):
            os.chown(path, CONTAINER_UID, CONTAINER_UID)      # (the image runs as the user sms, uid 10001)
        started = _podman(*global_opts, "run", "-d", *run_opts, "--name", name, "--network", "host",
                          "-v", f"{etc}:/etc/sms:ro", "-v", f"{data}:/var/lib/sms", "--env-file", str(etc / "sms.env"),
                          tag)                                 # (its CMD: serve --config /etc/sms/sms.toml)
        assert started.returncode == 0, started.stderr
        env = {"SMS_ADDRESS": f"127.0.0.1:{port}", "SMS_CA_FILE": str(etc / "ca" / "ca.pem"),
               "SMS_TOKEN": (etc / "admin.token").read_text().strip()}

        def serving() -> bool:
            if _podman("container", "exists", name).returncode != 0 or \
                    "running" not in _podman("inspect", "-f", "{{.State.Status}}", name).stdout:
                raise AssertionError(f"the container stopped:\n{_podman('logs', name).stdout[-3000:]}")
            done = subprocess.run([str(VENV_BIN / "sms"), "status"], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, **env})
            return done.returncode == 0 and "node n1 " in done.stdout
        wait_until(serving, NODE_START_S, "the node in the container serving")
        _sms("stream", "create", "boxed", "--partitions", "1", "--replication-factor", "1", env=env)
        _sms("put", "boxed", env=env, input_text="".join(f"record {i}\n" for i in range(100)))
        got = [json.loads(line)["data"] for line in _sms("read", "boxed", "--json", env=env).splitlines()]
        assert got == [f"record {i}" for i in range(100)]
        assert (data / "n1").is_dir() and (data / "n1").stat().st_uid == CONTAINER_UID
        user = _podman("exec", name, "id", "-u").stdout.strip()
        assert user == str(CONTAINER_UID), user
    finally:
        _podman("rm", "-f", "-t", "5", name)
        _podman("rmi", "-f", tag)
        # the build stage of the run before, untagged now (some 800 MB); the one of this run
        # keeps BUILD_CACHE_TAG
        stale = sorted(_dangling_images() - dangling_before)
        if stale:
            _podman("rmi", *stale)
