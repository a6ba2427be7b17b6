"""The typed client (issue 17 item 7): `mypy sms/` passes under mypy.ini (strict), and
every public method of sms.Client, sms.aio.Client and the producers has a docstring and
full annotations. CI runs the whole suite, so this enforces both."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from sms import aio, client, producer

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_strict_passes_on_sms():
    """sms/ and queues/ state and log (mypy.ini's `files`)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    run = subprocess.run([sys.executable, "-m", "mypy", "sms/", "queues/state.py", "queues/log.py"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"mypy sms/ queues/ failed:\n{run.stdout}{run.stderr}"


def test_py_typed_marker_is_there():
    assert (ROOT / "sms" / "py.typed").is_file()


def _public_methods(cls: type) -> list[str]:
    """Its own and those of the parts it is made of (sms.aio.Client is a facade over
    sms/aio/'s parts)."""
    names = []
    for part in cls.__mro__[:-1]:
        if part.__module__.split(".")[0] != "sms":
            continue
        names += [name for name, member in vars(part).items() if name not in names
                  and not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, classmethod))]
    return names


@pytest.mark.parametrize("cls", [client.Client, aio.Client, producer.Producer, producer.SyncProducer],
                         ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_public_methods_are_documented_and_annotated(cls):
    names = _public_methods(cls)
    assert names, f"{cls.__qualname__} has no public method"
    missing = []
    for name in names:
        method = getattr(cls, name)
        if not (inspect.getdoc(method) or "").strip():
            missing.append(f"{name}: no docstring")
        signature = inspect.signature(method)
        for param in signature.parameters.values():
            if param.name in ("self", "cls"):
                continue
            if param.annotation is inspect.Parameter.empty:
                missing.append(f"{name}: parameter {param.name} not annotated")
        if signature.return_annotation is inspect.Signature.empty:
            missing.append(f"{name}: no return annotation")
    assert not missing, f"{cls.__qualname__}:\n" + "\n".join(missing)
