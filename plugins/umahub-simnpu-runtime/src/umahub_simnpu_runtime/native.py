"""The C core as a ctypes library: found built, or compiled on first use.

Where the library comes from, first match wins:

1. ``UMAHUB_SIMNPU_LIBRARY``: a path to a built library (a board's own build);
2. the library built into the package at install (``_simnpu*.so``, by the
   package's ``setup.py``), if it was built from the sources next to it (the
   library carries the hash of its sources: an editable install whose
   ``sim.c`` changed since is not used stale);
3. compiled now from ``sim.c`` with the system's C compiler (``$CC``, ``cc``
   or ``gcc``; ``-O2 -shared -fPIC``) into a per-user cache,
   ``$UMAHUB_SIMNPU_CACHE`` or ``~/.cache/umahub-simnpu/<hash of the sources>/``:
   how a source checkout on ``PYTHONPATH`` runs. No compiler: a
   :class:`~umahub.plugin.device.DeviceError` naming what to install.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from umahub.plugin.device import DeviceError

__all__ = [
    "ABI_VERSION",
    "ERROR_BYTES",
    "Counters",
    "Interval",
    "TimingResult",
    "library",
    "source_hash",
]

#: The C core's ABI this module drives (``SNPU_ABI_VERSION`` in sim.h).
ABI_VERSION = 2
#: Size of the buffer the C core writes its messages into.
ERROR_BYTES = 512

_HERE = Path(__file__).resolve().parent
_SOURCES = ("sim.c", "sim.h")
_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c99")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None


class Counters(ctypes.Structure):
    """``snpu_counters`` of sim.h: what a device counted since it was made."""

    _fields_ = [
        ("instructions", ctypes.c_uint64),
        ("runs", ctypes.c_uint64),
        ("load_cycles", ctypes.c_uint64),
        ("gemm_cycles", ctypes.c_uint64),
        ("alu_cycles", ctypes.c_uint64),
        ("store_cycles", ctypes.c_uint64),
        ("macs", ctypes.c_uint64),
        ("compute_cycles", ctypes.c_uint64),
        ("cycles", ctypes.c_uint64),
        ("last_cycles", ctypes.c_uint64),
    ]

    def to_dict(self) -> dict[str, int]:
        """The counters by name."""
        return {name: int(getattr(self, name)) for name, _ in self._fields_}


class TimingResult(ctypes.Structure):
    """``snpu_timing_t`` of sim.h: a program's timeline in totals; arrays indexed by module
    (load, compute, store)."""

    _fields_ = [
        ("cycles", ctypes.c_uint64),
        ("busy", ctypes.c_uint64 * 3),
        ("instructions", ctypes.c_uint64 * 3),
        ("trace_len", ctypes.c_uint64),
    ]


class Interval(ctypes.Structure):
    """``snpu_interval`` of sim.h: when one instruction ran, cycles ``[start, end)``."""

    _fields_ = [
        ("index", ctypes.c_uint32),
        ("module", ctypes.c_uint8),
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
    ]


def source_hash(directory: Path = _HERE) -> str | None:
    """The hash of the C sources in ``directory`` (None where they are not shipped)."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        path = directory / name
        if not path.is_file():
            return None
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _cache_dir(digest: str) -> Path:
    root = os.environ.get("UMAHUB_SIMNPU_CACHE")
    if root:
        return Path(root) / digest
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "umahub-simnpu" / digest


def _compiler() -> str:
    for candidate in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate.split()[0]):
            return candidate
    raise DeviceError(
        "simnpu: no built simulator library and no C compiler to build it: install a C "
        "compiler (apt-get install gcc, or set CC), or install the package with "
        "pip install umahub-simnpu-runtime so that it is built at install"
    )


def _compile(digest: str) -> Path:
    """``sim.c`` compiled into the cache (atomically: processes may race for it)."""
    target = _cache_dir(digest) / "libsimnpu.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [
        *cc.split(),
        *_FLAGS,
        f'-DSNPU_SOURCE_HASH="{digest}"',
        "-o",
        partial,
        str(_HERE / "sim.c"),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise DeviceError(
                f"simnpu: compiling the simulator failed ({' '.join(command)}): "
                f"{done.stderr.strip()[-2000:]}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _built() -> list[Path]:
    """Libraries built into the package at install."""
    return [
        _HERE / f"_simnpu{suffix}"
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if (_HERE / f"_simnpu{suffix}").is_file()
    ]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c = ctypes
    err = (c.c_char_p, c.c_size_t)
    signatures = {
        "snpu_abi_version": (c.c_int, ()),
        "snpu_source_hash": (c.c_char_p, ()),
        "snpu_create": (c.c_void_p, (c.c_uint64, c.c_uint32, c.c_uint32, c.c_uint32, *err)),
        "snpu_destroy": (None, (c.c_void_p,)),
        "snpu_write": (c.c_int, (c.c_void_p, c.c_uint64, c.c_void_p, c.c_uint64, *err)),
        "snpu_read": (c.c_int, (c.c_void_p, c.c_uint64, c.c_void_p, c.c_uint64, *err)),
        "snpu_check": (
            c.c_int,
            (
                c.c_void_p,
                c.c_char_p,
                c.c_uint64,
                c.POINTER(c.c_uint32),
                c.POINTER(c.c_uint32),
                *err,
            ),
        ),
        "snpu_load": (c.c_void_p, (c.c_void_p, c.c_char_p, c.c_uint64, c.c_uint64, *err)),
        "snpu_unload": (None, (c.c_void_p,)),
        "snpu_execute": (
            c.c_int,
            (
                c.c_void_p,
                c.c_void_p,
                c.POINTER(c.c_uint64),
                c.POINTER(c.c_uint64),
                c.c_uint32,
                c.c_int64,
                *err,
            ),
        ),
        "snpu_counters_get": (None, (c.c_void_p, c.POINTER(Counters))),
        "snpu_timing": (
            c.c_int,
            (
                c.c_char_p,
                c.c_uint64,
                c.c_uint32,
                c.c_uint32,
                c.c_uint32,
                c.POINTER(TimingResult),
                c.POINTER(Interval),
                c.c_uint64,
                *err,
            ),
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = list(argtypes)
    return lib


def _open(path: Path) -> ctypes.CDLL | None:
    try:
        lib = _declare(ctypes.CDLL(str(path)))
    except (OSError, AttributeError):
        return None
    return lib if lib.snpu_abi_version() == ABI_VERSION else None


def library() -> ctypes.CDLL:
    """The C core, loaded once per process (see the module's docs for where from).

    Raises:
        DeviceError: no library and no way to build one.
    """
    global _library
    with _lock:
        if _library is not None:
            return _library
        given = os.environ.get("UMAHUB_SIMNPU_LIBRARY")
        if given:
            lib = _open(Path(given))
            if lib is None:
                raise DeviceError(
                    f"simnpu: UMAHUB_SIMNPU_LIBRARY={given} is not a simnpu library of ABI "
                    f"version {ABI_VERSION}"
                )
            _library = lib
            return lib
        digest = source_hash()
        for path in _built():
            lib = _open(path)
            if lib is not None and (digest is None or lib.snpu_source_hash().decode() == digest):
                _library = lib
                return lib
        if digest is None:
            raise DeviceError(
                "simnpu: the package has neither a built simulator library nor its C sources; "
                "reinstall umahub-simnpu-runtime"
            )
        lib = _open(_compile(digest))
        if lib is None:
            raise DeviceError(
                f"simnpu: the simulator compiled into {_cache_dir(digest)} does not load"
            )
        _library = lib
        return lib
