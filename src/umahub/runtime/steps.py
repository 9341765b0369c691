"""The step graph: a compiled model as steps over values, for the concurrent executor.

A :class:`StepGraph` is ``main`` of a placed model cut into steps
(:mod:`umahub.runtime.step_functions` cuts it at build time): **call** steps (a Relax
function of the library, called through the VM by name: a partition call or a
group of host code), **copy** steps (one ``R.to_vdevice``) and **alias** steps
(tuple fields; no data moves). Values are numbered: ``main``'s parameters
first, then every value a step defines. The graph travels in the library as
the JSON that its Relax function ``umahub_steps`` returns, so a library loaded
without the plugins carries it too (:func:`read_graph`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from umahub.lanes import dma_lane

__all__ = ["FORMAT", "GRAPH_FUNCTION", "Step", "StepGraph", "read_graph"]

#: The version of the JSON in ``umahub_steps``; a library with another one runs on the VM.
#: 2: a tuple alias lists its fields (``Step.fields``).
FORMAT = 2
#: The Relax function that returns the graph as JSON.
GRAPH_FUNCTION = "umahub_steps"


@dataclass(frozen=True)
class Step:
    """One step of the graph.

    Attributes:
        kind: ``"call"`` (a Relax function), ``"copy"`` or ``"alias"``.
        device: the device whose worker runs it (for a copy: its accelerator
            end; for an alias: where its value lives).
        inputs: the value ids it reads, in parameter order.
        outputs: the value ids it defines, in the order its function returns them.
        function: (call) the Relax function's name.
        label: what it is, for messages and the measured timeline: the
            partition's symbol, ``"host: lv1, lv2"``, ``"copy lv3 host->npu:0"``.
        partition: (call) the partition's symbol; "" for host code.
        mode: (copy) ``"sync"`` or ``"async"``; (alias) ``"same"``, ``"get"`` or
            ``"tuple"``.
        field: (alias ``"get"``) the index of the tuple field.
        fields: (alias ``"tuple"``) the value id of each field, in order: a value
            may be two fields (``(a, b, a)``), where ``inputs`` lists it once.
        src: (copy) the device the tensor comes from.
        dst: (copy) the device it goes to.
        dst_index: (copy) the runtime device index of ``dst``.
    """

    kind: str
    device: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    function: str = ""
    label: str = ""
    partition: str = ""
    mode: str = ""
    field: int = 0
    fields: tuple[int, ...] = ()
    src: str = ""
    dst: str = ""
    dst_index: int = 0


@dataclass(frozen=True)
class StepGraph:
    """``main`` as steps over values; value ids ``0 .. params-1`` are ``main``'s parameters.

    Attributes:
        devices: the virtual devices, index = runtime device index.
        params: how many parameters ``main`` has (inputs, then lifted weights).
        values: how many value ids there are.
        steps: the steps, in model order (a topological order).
        output: the model's result: a value id, or a list of them (nested for
            nested tuples).
        copy_kind: accelerator instance -> ``"sync"`` or ``"async"``.
        unsupported: why ``main`` could not be cut ("" when it was).
    """

    devices: tuple[str, ...]
    params: int = 0
    values: int = 0
    steps: tuple[Step, ...] = ()
    output: Any = None
    copy_kind: Mapping[str, str] = field(default_factory=dict)
    unsupported: str = ""

    def to_json(self) -> str:
        """The graph as JSON (what ``umahub_steps`` returns)."""
        data = asdict(self)
        data["steps"] = [_compact(s) for s in self.steps]
        return json.dumps({"umahub_steps": FORMAT, **data}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StepGraph:
        """Read :meth:`to_json`'s text; a graph of another format is ``unsupported``."""
        data = json.loads(text)
        if data.pop("umahub_steps", None) != FORMAT:
            return cls((), unsupported="its step graph was written by another umahub version")
        steps = tuple(
            Step(
                **{
                    **s,
                    "inputs": tuple(s.get("inputs", ())),
                    "outputs": tuple(s.get("outputs", ())),
                    "fields": tuple(s.get("fields", ())),
                }
            )
            for s in data.pop("steps")
        )
        return cls(**{**data, "devices": tuple(data["devices"]), "steps": steps})

    @property
    def lanes(self) -> list[str]:
        """The workers this graph needs: its devices, then a DMA lane per async copier."""
        used = list(dict.fromkeys(s.device for s in self.steps if s.kind != "alias"))
        dma = [dma_lane(s.device) for s in self.steps if s.kind == "copy" and s.mode == "async"]
        return [d for d in self.devices if d in used] + list(dict.fromkeys(dma))


def _compact(step: Step) -> dict[str, Any]:
    defaults = Step("", "", (), ())
    return {k: v for k, v in asdict(step).items() if v != getattr(defaults, k) or k == "kind"}


def read_graph(vm: Any, devices: Sequence[str]) -> StepGraph:
    """The step graph a loaded library carries (an ``unsupported`` one when it has none)."""
    try:
        function = vm[GRAPH_FUNCTION]
    except Exception:  # built for one device, or by an umahub without step graphs
        return StepGraph(tuple(devices), unsupported="the library has no step graph")
    return StepGraph.from_json(str(function()))
