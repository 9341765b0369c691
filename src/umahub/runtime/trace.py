"""A measured run as a Chrome trace: the timeline that Perfetto and ``chrome://tracing`` open.

:meth:`umahub.Compiled.profile` and :meth:`umahub.LoadedModel.profile` measure
every step the concurrent executor runs (``profile(..., trace="run.json")``
writes it, as does ``umahub bench MODEL.so --trace run.json``);
:func:`chrome_trace` turns what they return (or a report's ``measured``) into
the Trace Event Format (a JSON object with ``traceEvents``):

* the model is one process (``pid`` 1, named ``umahub <model>``); each lane
  of the executor is one thread of it, a *track*: every device (``host``,
  ``npu:0``, a device with a runtime of its own, whose partitions run on its
  track) and every DMA lane (``npu:0 DMA``), named by ``thread_name`` and
  ordered as the report's timeline orders them (:func:`umahub.lanes.ordered`):
  each device followed by its DMA lane;
* each step is a complete event (``ph: "X"``) named by its label (a
  partition's symbol, ``"host: lv1"``, ``"copy x host->npu:0"``), with ``cat``
  ``"compute"`` or ``"copy"``, and in ``args`` its device, lane, ``kind``
  (``compute``, ``sync``, ``async``), the inference it belongs to and, for a
  copy, its ``bytes``;
* ``ts`` and ``dur`` are microseconds: ``dur`` is the measured span exactly
  (``(end - start) * 1e6``); every timed run of the profile appears, one
  after the other, at the time it started after the first (data measured by
  an older umahub holds the median run alone: that one inference, from 0).

``otherData`` carries what is not a span: the executor, the runs, both
executors' median seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError
from umahub.lanes import device_of, ordered

__all__ = ["PID", "chrome_trace", "save_trace", "vm_alone"]

#: The process id of the model in the trace (one model per trace).
PID = 1


def vm_alone(why: str) -> UmahubError:
    """The error of a trace asked of a model that runs on TVM's VM alone, for ``why``
    (``"one device only"``): the VM times no steps."""
    return UmahubError(
        f"nothing to trace: the model runs on TVM's VM alone ({why}), which times no "
        "steps; a trace shows the concurrent executor's steps, on a model placed on more "
        "than one device"
    )


def _inferences(measured: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every measured inference, each with its ``start`` (seconds after the first)."""
    runs = measured.get("inferences")
    if runs:
        return list(runs)
    return [{"start": 0.0, "spans": measured.get("spans") or []}]


def chrome_trace(measured: Mapping[str, Any], name: str = "") -> dict[str, Any]:
    """The Trace Event Format object of a measured run (see the module).

    Args:
        measured: what ``profile`` returns (a report's ``measured``).
        name: the model's name, shown as the process's (``umahub <name>``).

    Raises:
        UmahubError: ``measured`` holds no steps: the model ran on the VM
            alone, or was not profiled.
    """
    inferences = _inferences(measured)
    if not any(run.get("spans") for run in inferences):
        why = measured.get("why")
        if why:
            raise vm_alone(why)
        raise UmahubError(
            "nothing to trace: no measured run; profile the model first "
            "(Compiled.profile, LoadedModel.profile, or profile = true in [tool.umahub])"
        )
    spans = [s for run in inferences for s in run.get("spans") or ()]
    lanes = ordered([*(measured.get("lanes") or {}), *(s["lane"] for s in spans)])
    tid = {lane: k + 1 for k, lane in enumerate(lanes)}
    process = f"umahub {name}" if name else "umahub"
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": process}}
    ]
    for lane, k in tid.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": PID, "tid": k, "args": {"name": lane}}
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": PID,
                "tid": k,
                "args": {"sort_index": k},
            }
        )
    steps = []
    for n, run in enumerate(inferences, 1):
        at = float(run.get("start", 0.0))
        for s in run.get("spans") or ():
            kind = s["kind"]
            args: dict[str, Any] = {
                "device": device_of(s["lane"]),
                "lane": s["lane"],
                "kind": kind,
                "inference": n,
            }
            if kind != "compute":
                args["bytes"] = int(s.get("bytes", 0))
            steps.append(
                {
                    "name": s["label"],
                    "cat": "compute" if kind == "compute" else "copy",
                    "ph": "X",
                    "ts": (at + s["start"]) * 1e6,
                    "dur": (s["end"] - s["start"]) * 1e6,
                    "pid": PID,
                    "tid": tid[s["lane"]],
                    "args": args,
                }
            )
    steps.sort(key=lambda e: (e["tid"], e["ts"]))
    other = {
        key: measured[key]
        for key in ("executor", "runs", "vm_seconds", "concurrent_seconds")
        if key in measured
    }
    return {
        "traceEvents": events + steps,
        "displayTimeUnit": "ms",
        "otherData": {"model": name, "inferences": len(inferences), **other},
    }


def save_trace(measured: Mapping[str, Any], path: str | os.PathLike, name: str = "") -> Path:
    """Write :func:`chrome_trace` of ``measured`` to ``path`` (open it in Perfetto,
    https://ui.perfetto.dev, or ``chrome://tracing``); returns the path.

    Raises:
        UmahubError: nothing to trace (see :func:`chrome_trace`), or ``path``
            cannot be written.
    """
    text = json.dumps(chrome_trace(measured, name))
    path = Path(path)
    try:
        path.write_text(text + "\n")
    except OSError as exc:
        raise UmahubError(
            f"cannot write the trace to {path}: {exc.strerror or exc}; give a file in a "
            "directory that exists and that you can write to"
        ) from exc
    return path
