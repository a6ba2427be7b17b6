"""The compiled part of the build: sms._wire, a C extension for sms/wire.py's hot
functions. It is optional: where no compiler (or no Python headers) is found, or when
SMS_NO_COMPILE=1, the install goes on without it and sms.wire uses its pure-Python
reference; the build says so once. Everything else is declared in pyproject.toml."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a failed compile leaves the reference."""

    def run(self):
        if os.environ.get("SMS_NO_COMPILE", "") not in ("", "0"):
            self._say("SMS_NO_COMPILE is set")
            return
        try:
            super().run()
        except Exception as e:  # noqa: BLE001  (any failure of the toolchain)
            self._say(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._say(e)

    @staticmethod
    def _say(why) -> None:
        print(f"sms-sps: the compiled wire codec was not built ({why}); sms.wire uses its pure-Python "
              "reference, which is correct and slower", file=sys.stderr)


setup(
    ext_modules=[Extension("sms._wire", sources=["sms/_wire.c"], depends=["sms/_native/xxhash.h"],
                           extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wno-unused-function"],
                           optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
