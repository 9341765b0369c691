"""Files the command line reads and writes: checked up front, read without surprises."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError

__all__ = ["check_writable", "read_inputs"]


def check_writable(path: str, option: str) -> None:
    """Refuse, before any work, a file ``option`` could not write when the work is done."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UmahubError(f"{option} {path}: is a directory; give a file name")
    if not parent.exists():
        raise UmahubError(
            f"{option} {path}: the directory {parent} does not exist; create it first"
        )
    if not parent.is_dir():
        raise UmahubError(f"{option} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UmahubError(f"{option} {path}: permission denied; choose a place you can write to")


def read_inputs(path: str) -> list[Any]:
    """The arrays of an ``.npz`` file, in order, or the one array of an ``.npy`` file.

    Pickled objects are refused: an inputs file is data, never code to run.
    """
    import numpy as np

    if not os.path.isfile(path):
        raise UmahubError(f"--inputs {path}: no such file")
    how = "write one with numpy.savez(path, x0, x1, ...) or numpy.save(path, x)"
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY" and not magic.startswith(b"PK"):
        raise UmahubError(f"--inputs {path}: not a NumPy .npz or .npy file; {how}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UmahubError(
            f"--inputs {path}: a damaged or unreadable NumPy file ({_first_sentence(exc)}); {how}"
        ) from exc
    if isinstance(loaded, np.ndarray):
        return [loaded]
    with loaded:
        try:
            arrays = [loaded[k] for k in loaded.files]
        except (ValueError, OSError, zipfile.BadZipFile) as exc:
            raise UmahubError(
                f"--inputs {path}: an array in it cannot be read ({_first_sentence(exc)}); {how}"
            ) from exc
    if not arrays:
        raise UmahubError(f"--inputs {path}: holds no arrays; {how}")
    return arrays


def _first_sentence(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.split(". ")[0].rstrip(".") if text else type(exc).__name__
