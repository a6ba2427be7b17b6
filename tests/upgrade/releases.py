"""The previous release, built from its tag, and a local cluster whose nodes run either it
or this checkout's code (tests/upgrade/test_rolling_upgrade.py).

`find_release(tag)` looks the tag up in this checkout's git history (None and the reason
when there is none: an sdist, a clone without its tags). `build_release` extracts that
commit's tree with `git archive` into a directory of the test's (the repository's
worktree list is left alone) and builds its compiled wire codec there, as its own install
would (`setup.py build_ext --inplace`, a few seconds; where no compiler is found the
release runs its pure-Python codec, as its install would, and `Release.codec` says so).

`MixedCluster` is node.launcher.LocalCluster with each node's command run under
`env -C TREE PYTHONPATH=TREE`, TREE being the old release's tree or this checkout's:
`python -m node serve` puts its working directory first on sys.path, ahead of the venv's
editable install, so every package of the project (sms, node, storage, control, ...)
comes from TREE, and the venv's third-party packages are shared. `code_of(node_id)`
reads from /proc which tree a running node works in and which compiled codec it mapped,
so the test proves that each node runs the code it means.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from node.launcher import LocalCluster

PREVIOUS_RELEASE = "v0.1.0"       # the release this checkout upgrades from; the next release's tag goes here
# ... and its commit: a clone without tags (CI's may fetch none) still finds it in main's history
RELEASE_COMMITS = {"v0.1.0": "dfb8e61d7f395f197c6b435c3ae14caf9db9031a"}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_TIMEOUT_S = 300.0           # git archive + the C extension's compile
PROBE_TIMEOUT_S = 60.0
OLD, NEW = "old", "new"           # what a MixedCluster node runs: the previous release or this checkout

# the project's own packages: each must come from the tree a node is started in
PACKAGES = ("sms", "node", "storage", "control", "ingestion", "retrieval", "metastore", "kernel", "queues")


@dataclass(frozen=True)
class Release:
    """Source of one release, ready to run: the tag, its commit, the extracted tree, its
    data-directory format (storage/dataformat.py CURRENT) and its wire codec in force."""

    tag: str
    commit: str
    tree: str
    data_format: int
    codec: str            # "compiled" or "python" (sms.wire.IMPLEMENTATION)


def find_release(tag: str, repo: str = REPO_ROOT) -> tuple[str | None, str]:
    """(the commit the tag names, "") or (None, why it cannot be found)."""
    if shutil.which("git") is None:
        return None, "git is not installed"
    if not os.path.exists(os.path.join(repo, ".git")):
        return None, f"{repo} is not a git checkout (installed from an sdist?): no release history to upgrade from"
    def commit_of(name: str) -> str | None:
        found = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                               capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        return found.stdout.strip() if found.returncode == 0 else None

    recorded = RELEASE_COMMITS.get(tag)
    tagged = commit_of(tag)
    if tagged is not None:
        assert recorded in (None, tagged), f"tag {tag} names {tagged}, not the release's commit {recorded}: moved?"
        return tagged, ""
    if recorded is not None and commit_of(recorded) == recorded:
        return recorded, ""                   # (a clone without the tag: the commit is in main's history)
    return None, (f"neither tag {tag} nor its commit {recorded} in {repo}'s git history (a shallow clone? "
                  "git fetch --unshallow --tags)")


def tree_prefix(tree: str) -> list[str]:
    """What runs a command on the code of `tree` (module docstring)."""
    return ["env", "-C", tree, f"PYTHONPATH={tree}"]


def probe(tree: str) -> dict:
    """Where the project's packages come from, the data-directory format and the wire
    codec, for a Python started as a node of `tree` is."""
    code = ("import importlib, json, sys; from storage import dataformat; from sms import wire; "
            f"print(json.dumps({{'files': {{p: importlib.import_module(p).__file__ for p in {PACKAGES!r}}}, "
            "'format': dataformat.CURRENT, 'codec': wire.IMPLEMENTATION, "
            "'compiled': getattr(wire.compiled, '__file__', None)}))")
    out = subprocess.run(tree_prefix(tree) + [sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=PROBE_TIMEOUT_S)
    assert out.returncode == 0, f"probing {tree} failed:\n{out.stderr}"
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    stray = {p: f for p, f in facts["files"].items() if not _under(f, tree)}
    stray.update({"sms._wire": facts["compiled"]} if facts["compiled"] and not _under(facts["compiled"], tree) else {})
    assert not stray, f"a node of {tree} would import these from elsewhere: {stray}"
    return facts


def build_release(tag: str, commit: str, dest: str, repo: str = REPO_ROOT) -> Release:
    """The release's tree extracted into `dest` (new) and its codec built in place."""
    os.makedirs(dest)
    archive = subprocess.Popen(["git", "-C", repo, "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    try:
        untar = subprocess.run(["tar", "-x", "-C", dest], stdin=archive.stdout, capture_output=True,
                               timeout=BUILD_TIMEOUT_S)
    finally:
        archive.stdout.close()
        archive.wait(BUILD_TIMEOUT_S)
    assert archive.returncode == 0 and untar.returncode == 0, f"git archive {commit} | tar -x: {untar.stderr!r}"
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest,
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, f"building {tag}'s codec failed:\n{built.stdout}\n{built.stderr}"
    facts = probe(dest)
    return Release(tag, commit, dest, facts["format"], facts["codec"])


def _under(path: str, tree: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(tree) + os.sep)


class MixedCluster(LocalCluster):
    """A LocalCluster whose nodes each run the old release or this checkout (`runs`);
    every node starts on the old release. `replace(node_id)` is one step of a rolling
    upgrade."""

    def __init__(self, data_dir: str, old: Release, **options):
        super().__init__(data_dir, **options)
        self.old = old
        self.new_codec = probe(REPO_ROOT)["codec"]
        self.runs: dict[str, str] = {node_id: OLD for node_id in self.procs}

    def tree_of(self, node_id: str) -> str:
        return self.old.tree if self.runs[node_id] == OLD else REPO_ROOT

    def command_prefix(self, node_id: str) -> list[str]:
        return tree_prefix(self.tree_of(node_id))

    def stop_node(self, node_id: str, timeout_s: float) -> int:
        """SIGTERM (a storage node drains and deregisters); its exit code."""
        proc = self.procs[node_id].proc
        proc.terminate()
        return proc.wait(timeout=timeout_s)

    def replace(self, node_id: str, timeout_s: float) -> int:
        """Stop the node (SIGTERM) and start it on this checkout's code: the same id, data
        directory and addresses. Returns the old process's exit code."""
        code = self.stop_node(node_id, timeout_s)
        self.runs[node_id] = NEW
        self.restart(node_id)            # (it is stopped: spawn, wait for its ready file)
        return code

    def code_of(self, node_id: str) -> tuple[str, list[str]]:
        """The running node's working directory (the tree its packages come from) and the
        compiled codec files it has mapped (none on the pure-Python codec)."""
        pid = self.procs[node_id].pid
        cwd = os.readlink(f"/proc/{pid}/cwd")
        with open(f"/proc/{pid}/maps") as f:
            mapped = sorted({line.split(None, 5)[5].strip() for line in f
                             if len(line.split(None, 5)) == 6 and "/_wire." in line})
        return cwd, mapped

    def assert_runs(self, node_id: str) -> None:
        """The node runs the tree `runs` says: its working directory is that tree, and the
        compiled codec it mapped (where that tree has one built) is that tree's."""
        tree = self.tree_of(node_id)
        cwd, mapped = self.code_of(node_id)
        assert os.path.realpath(cwd) == os.path.realpath(tree), f"{node_id} runs in {cwd}, not {tree}"
        codec = self.old.codec if self.runs[node_id] == OLD else self.new_codec
        assert mapped or codec != "compiled", f"{node_id} ({self.runs[node_id]}) mapped no compiled codec"
        assert all(_under(path, tree) for path in mapped), f"{node_id} ({self.runs[node_id]}) mapped {mapped}"
