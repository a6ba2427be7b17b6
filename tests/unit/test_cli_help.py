"""Every `sms` subcommand, option and positional argument has help text, and the shell
completes them (node/cli/).

Walks the parser that `sms` builds: each subcommand listed with a help line, and each
argument of each (sub)parser with a non-empty help, except argparse's own --help.
Arguments hidden on purpose (help=argparse.SUPPRESS) count as documented. Completion is
driven as the shell drives it: `sms` run with argcomplete's environment variables (no
cluster, no socket), and the code `sms completion bash` prints, in a real bash.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

import node.cli
from node.cli import build_parser

COMMAND_TIMEOUT_S = 30
SMS = [sys.executable, "-m", "node"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(node.cli.__file__))))   # (where `-m node` is found)


def _parsers(parser: argparse.ArgumentParser, path: str = "sms") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _subcommands_without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest for a in action._choices_actions if (a.help or "").strip()}
            missing += [f"{path} {name}" for name in action.choices if name not in helped]
    return missing


def test_every_subcommand_has_help():
    missing = [m for path, parser in _parsers(build_parser()) for m in _subcommands_without_help(parser, path)]
    assert not missing, f"subcommands without help: {missing}"


def test_every_argument_has_help():
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip():
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"arguments without help: {missing}"


def test_the_walk_sees_the_whole_parser():
    """(So the tests above cannot pass by seeing nothing.)"""
    paths = {path for path, _ in _parsers(build_parser())}
    assert {"sms", "sms up", "sms stream repartition", "sms consumer reset", "sms completion"} <= paths
    options = {o for _, parser in _parsers(build_parser()) for a in parser._actions for o in a.option_strings}
    assert {"--version", "--nodes", "--partitions", "--key", "--follow"} <= options


def _complete(tmp_path, line: str) -> list[str]:
    """What `sms` offers for the command line `line` (cursor at its end), as bash's hook
    asks for it (argcomplete: candidates separated by $_ARGCOMPLETE_IFS)."""
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_IFS": "\v", "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
    done = subprocess.run(SMS, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, cwd=ROOT)
    assert done.returncode == 0, done
    return out.read_text().split("\v")


def test_completion_offers_commands_and_options(tmp_path):
    assert [c.strip() for c in _complete(tmp_path, "sms str")] == ["stream"]
    assert {"create", "repartition"} <= {c.strip() for c in _complete(tmp_path, "sms stream ")}
    assert "--follow" in {c.strip() for c in _complete(tmp_path, "sms read s --fo")}


def test_the_marker_that_global_completion_looks_for():
    with open(node.cli.__file__) as f:
        assert "PYTHON_ARGCOMPLETE_OK" in f.read(1024)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_sms_completion_prints_shell_code(shell):
    done = subprocess.run([*SMS, "completion", shell], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                          cwd=ROOT)
    assert done.returncode == 0 and done.stderr == ""
    assert "complete" in done.stdout and "sms" in done.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_bash_completes_with_what_sms_completion_prints(tmp_path):
    """The rc line the help gives, `eval "$(sms completion bash)"`, then a Tab after
    `sms stream re` as bash runs it (its completion function, with `sms` on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sms").write_text(f"#!/bin/sh\nexec {sys.executable} -m node \"$@\"\n")
    (bin_dir / "sms").chmod(0o755)
    script = ('eval "$(sms completion bash)"; COMP_LINE="sms stream re"; COMP_POINT=${#COMP_LINE}; '
              'COMP_WORDS=(sms stream re); COMP_CWORD=2; _python_argcomplete sms re stream; '
              'printf "%s\\n" "${COMPREPLY[@]}"')
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, done
    assert [c.strip() for c in done.stdout.splitlines()] == ["repartition"], done
