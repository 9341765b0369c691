"""Builds the simulator's C core into the package: a plain shared library loaded with ctypes
(``umahub_simnpu_runtime/_simnpu*.so``), carrying the hash of its sources."""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "src" / "umahub_simnpu_runtime"


def source_hash() -> str:
    """The same hash as umahub_simnpu_runtime.native.source_hash (read without importing it)."""
    import hashlib

    digest = hashlib.sha256()
    for name in ("sim.c", "sim.h"):
        digest.update(name.encode() + b"\0" + (PACKAGE / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class BuildLibrary(build_ext):
    """build_ext for a library that is not a Python module (no PyInit_ symbol to export)."""

    def get_export_symbols(self, ext):
        return []


setup(
    ext_modules=[
        Extension(
            "umahub_simnpu_runtime._simnpu",
            sources=["src/umahub_simnpu_runtime/sim.c"],
            depends=["src/umahub_simnpu_runtime/sim.h"],
            define_macros=[("SNPU_SOURCE_HASH", f'"{source_hash()}"')],
            extra_compile_args=["-O2", "-std=c99"],
        )
    ],
    cmdclass={"build_ext": BuildLibrary},
)
