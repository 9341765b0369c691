"""The compile context: what earlier stages decided, handed forward to every hook."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from umahub.config import Config
    from umahub.plugin.accelerator import Accelerator
    from umahub.plugin.memory import MemoryPlan

__all__ = ["CompileContext", "Copy", "CostContext", "Operator"]


@dataclass(frozen=True)
class Operator:
    """One operator of the model, as placement saw it.

    Attributes:
        name: the node's name (the Relax variable it binds, e.g. ``"lv3"``).
        op: the operator (``"relax.nn.conv2d"``).
        device: where it runs, ``"host"`` or ``"accel:i"``.
        pattern: the pattern that claimed it (``"npu.conv2d"``); "" on the host.
        partition: the symbol of its partition; "" on the host.
        pinned: the pin that placed it (``"conv*"``), or "".
        inputs: the nodes whose outputs it reads (model inputs and constants
            left out), in argument order.
        flops: floating-point operations of one call, from static shapes (0
            when unknown).
        bytes: the size of its output, from static shapes (0 when unknown).
        refused: why accelerators did not take it, accelerator -> reason: for
            each accelerator a pattern of which matched the operator but whose
            check refused the match, the reason the first such check gave
            (``umahub.Refusal``; "" when it returned a plain false). The
            accelerator it runs on is left out.
    """

    name: str
    op: str
    device: str = "host"
    pattern: str = ""
    partition: str = ""
    pinned: str = ""
    inputs: tuple[str, ...] = ()
    flops: int = 0
    bytes: int = 0
    refused: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Copy:
    """One tensor copied between virtual devices.

    Attributes:
        tensor: the variable copied (``"weight"`` for a weight, ``"constant"``).
        src: the virtual device it comes from.
        dst: the virtual device it goes to.
        bytes: its size (0 when not known at compile time).
        kind: ``"sync"`` (the CPU copies) or ``"async"`` (a DMA engine copies).
        constant: whether it is a constant (a weight).
        when: ``"inference"`` (at every inference) or ``"load"`` (once, at load).
        producer: the operator (node name) or partition (symbol) that made
            the tensor; "" for a model input or a constant.
        consumer: the operator or partition that reads it on ``dst``; "" for
            a model output.
        in_place: neither device has a memory of its own (each is the host's
            memory): TVM's VM reads the tensor where it is and copies nothing
            (:mod:`umahub.compiler.one_memory`); the concurrent executor
            copies it (on the copy engine of an ``async`` pool). A weight
            (``when="load"``) is read where the library holds it, by both.
    """

    tensor: str
    src: str
    dst: str
    bytes: int
    kind: str
    constant: bool = False
    when: str = "inference"
    producer: str = ""
    consumer: str = ""
    in_place: bool = False

    def to_dict(self) -> dict:
        """JSON-ready form for the report."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class CompileContext:
    """What a hook may know of the compile so far. Hooks read it; they never change it.

    Attributes:
        config: the validated ``[tool.umahub]``.
        accelerator: the accelerator the partition is placed on.
        instance: which of its instances (``device`` is ``"name:instance"``).
        symbol: the partition's symbol: the PrimFunc and the runtime function
            a codegen produces must carry this name.
        operators: the partition's operators.
        memory: the memory plan so far (bytes used and free per pool, host
            included), partitions lowered earlier already counted.
        tir_pipeline: the name of the TIR pipeline that runs the phase passes
            (give it to ``tvm.tirx.build(..., pipeline=...)``); set at codegen.
        target: the ``tvm.target.Target`` (LLVM) the user builds the model for
            (``hub.compile(mod, target=...)``, ``--target``), which may be
            another architecture than this machine's: a codegen that builds
            LLVM builds for it (``tvm.tirx.build(module, target=context.target,
            ...)``). None: no target was given, build for this machine as you
            would. Added to contract 1: a plugin that ignores it works for
            native builds; only cross builds need it.
        weights: indices of the partition's inputs that the model passes as
            constants (its weights): a schedule may pack these at compile time
            (:func:`umahub.plugin.pack_weight`). Added to contract 1.
        constants: the values of those inputs, by index (``tvm.runtime.Tensor``;
            ``.numpy()`` gives an array): what a device's codegen folds at
            compile time (a quantized operator's scales and zero points, its
            weights laid out for the device). Added to contract 1.
        options: the accelerator's backend options in effect, read-only:
            every option it declares (``Accelerator(options=...)``), by its
            declared name, with the user's value (``[tool.umahub.options.<name>]``,
            ``--option``, ``Hub(config=...)``), already checked against the
            option's type and choices, or the default
            (``context.options["double-buffering"]``). Added to contract 1.
    """

    config: Config
    accelerator: Accelerator
    instance: int
    symbol: str
    operators: tuple[Operator, ...] = ()
    memory: MemoryPlan | None = None
    tir_pipeline: str = field(default="default")
    target: Any = None
    weights: frozenset[int] = frozenset()
    constants: Mapping[int, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """The virtual device, ``"name:instance"``."""
        return f"{self.accelerator.name}:{self.instance}"

    @property
    def pool_free(self) -> int | None:
        """Bytes still free in the accelerator's first pool on this instance, or None."""
        if self.memory is None or self.accelerator.pool is None:
            return None
        return self.memory.free(self.device, self.accelerator.pool.scope)


@dataclass(frozen=True)
class CostContext:
    """What ``umahub_cost`` may know of a candidate group. Hooks read it; they never change it.

    Attributes:
        config: the validated ``[tool.umahub]``.
        accelerator: the accelerator the group would run on.
        operators: the group's operators (names, ops, FLOPs, output bytes), in model order.
        patterns: the patterns that matched it (``"npu.conv2d_bias_relu"``).
        target: the ``tvm.target.Target`` the model is built for; None: this machine.
        options: the accelerator's backend options in effect, read-only, as
            :attr:`CompileContext.options`: a cost model of a tiling option
            reads the tiling the compile will use.
    """

    config: Config
    accelerator: Accelerator
    operators: tuple[Operator, ...] = ()
    patterns: tuple[str, ...] = ()
    target: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        """The group's floating-point operations per call (0 where shapes are unknown)."""
        return sum(o.flops for o in self.operators)
