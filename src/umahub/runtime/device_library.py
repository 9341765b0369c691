"""The programs of device partitions in an exported library: one blob and the JSON that
locates its parts.

:meth:`umahub.Compiled.export_library` appends the blob after the shared library's
image and the entries to its JSON trailer (:mod:`umahub.runtime.compiled`), so the
trailer's hash covers the programs and weights too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from umahub.plugin.device import DeviceProgram
from umahub.runtime.devices import DeviceCall

__all__ = ["from_library", "to_library"]


def to_library(calls: Sequence[DeviceCall]) -> tuple[bytes, list[dict[str, Any]]]:
    """The calls as one blob (programs and constants) and JSON entries that locate
    their parts in it (offsets relative to the blob's start)."""
    blob = bytearray()
    entries = []

    def put(data: bytes) -> list[int]:
        start = len(blob)
        blob.extend(data)
        return [start, len(data)]

    for call in calls:
        entries.append(
            {
                "symbol": call.symbol,
                "accelerator": call.accelerator,
                "instance": call.instance,
                "runtime": call.runtime,
                "package": call.package,
                "program": put(call.program.data),
                "metadata": dict(call.program.metadata),
                "inputs": list(call.inputs),
                "constants": [
                    {"dtype": str(c.dtype), "shape": list(c.shape), "at": put(c.tobytes())}
                    for c in call.constants
                ],
            }
        )
    return bytes(blob), entries


def from_library(entries: Sequence[Mapping[str, Any]], blob: bytes) -> list[DeviceCall]:
    """The calls that :func:`to_library` wrote.

    Raises:
        ValueError: an entry does not fit the blob (a damaged library).
    """

    def get(at: Sequence[int]) -> bytes:
        start, size = int(at[0]), int(at[1])
        if start < 0 or size < 0 or start + size > len(blob):
            raise ValueError("a device program lies outside the library")
        return blob[start : start + size]

    calls = []
    for e in entries:
        constants = tuple(
            np.frombuffer(get(c["at"]), dtype=c["dtype"]).reshape(c["shape"])
            for c in e["constants"]
        )
        calls.append(
            DeviceCall(
                symbol=str(e["symbol"]),
                accelerator=str(e["accelerator"]),
                instance=int(e["instance"]),
                runtime=str(e["runtime"]),
                package=str(e["package"]),
                program=DeviceProgram(get(e["program"]), e.get("metadata", {})),
                inputs=tuple(int(i) for i in e["inputs"]),
                constants=constants,
            )
        )
    return calls
