"""moto's S3 server as its own process (tests of s3:// archives and channels): a real HTTP
S3 that boto3 reaches at `endpoint`, on a port that stays its own across a restart (a
store that goes away and comes back, empty: moto keeps objects in memory)."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.conftest import wait_until
from tests.zkserver import free_port

MOTO_START_TIMEOUT_S = 30.0


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "MotoServer":
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"moto.server exited with {self.proc.returncode}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0
        wait_until(answers, MOTO_START_TIMEOUT_S, f"moto.server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def s3(self):
        import boto3
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint)
