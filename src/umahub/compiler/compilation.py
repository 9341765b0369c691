"""One compilation, flowing forward: the state that stages read and add to.

:class:`Compilation` is made by :func:`umahub.compiler.pipeline.compile` (or
``explain``) and handed from stage to stage (:mod:`umahub.compiler.stages`). Each stage
reads what earlier stages wrote and adds its own fields; none reaches back to
change an earlier stage's decision except through :meth:`Compilation.fall_back`,
which records why a partition goes back to the host. The report is derived
from it once, at the end (:meth:`Compilation.report`).

The ``on-error`` policy lives here, in one place: :meth:`Compilation.fail`
either raises or warns (pointing at the user's call) and keeps the message
for the report.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import tvm
from tvm import relax

from umahub.compiler.lowering import CONSTANT_LIMIT, with_constant_inputs
from umahub.errors import CompileError, warn
from umahub.host.prepack import Packers
from umahub.hub.tracing import HookCall
from umahub.ir import is_partition, partition_constants, partition_functions
from umahub.plugin.context import Copy, Operator
from umahub.plugin.memory import MemoryPlan, Need
from umahub.report.report import PartitionReport, Report

if TYPE_CHECKING:
    from umahub.compiler.placement import Pins, PlannedPattern
    from umahub.runtime.compiled import Compiled
    from umahub.targets import BuildTarget

__all__ = ["Clock", "Compilation", "Partition", "Partitioned", "Progress", "written"]

_T = TypeVar("_T")


def written(value: _T | None, name: str) -> _T:
    """``value``, a field of the compilation named ``name`` that an earlier stage writes.

    A stage reads what the stages before it wrote; a field still unset means the
    stages ran out of order, a bug in umahub, not the user's.
    """
    if value is None:
        raise CompileError(
            f"the compilation's {name} is read before a stage wrote it: a bug in umahub"
        )
    return value


Progress = Callable[[str, str], None]


class Clock:
    """Times the stages and hooks, and tells ``progress`` when each stage starts."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.stages: dict[str, float] = {}
        self.hooks: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        """Time the block as (part of) stage ``name``."""
        if self.progress is not None:
            self.progress(name, detail)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - start

    def count(self, calls: list[HookCall]) -> None:
        """Add the time of these hook calls to their hooks."""
        for c in calls:
            key = c.hook.removeprefix("umahub_")
            self.hooks[key] = self.hooks.get(key, 0.0) + c.seconds


@dataclass(frozen=True)
class Partition:
    """One partition: its symbol, where it runs, what it holds."""

    symbol: str
    accelerator: str
    instance: int
    patterns: tuple[str, ...]
    operators: tuple[Operator, ...]

    @property
    def device(self) -> str:
        """The virtual device, ``"name:instance"``."""
        return f"{self.accelerator}:{self.instance}"


@dataclass(frozen=True)
class Partitioned:
    """The partitioned module, its partitions in model order, every operator's placement."""

    mod: tvm.IRModule
    partitions: tuple[Partition, ...]
    operators: tuple[Operator, ...]
    #: each quantized operator as (its final quantize's node, its kind, why no
    #: accelerator took it: "" when one did, whether umahub computes it in integers)
    quantized: tuple[tuple[str, str, str, bool], ...] = ()

    def to_host(self, symbols: set[str]) -> Partitioned:
        """The same, with the partitions named by ``symbols`` sent back to the host."""
        if not symbols:
            return self
        funcs = {}
        for gv, f in self.mod.functions.items():
            if is_partition(f) and str(f.attrs["global_symbol"]) in symbols:
                f = f.without_attr("Codegen").without_attr("global_symbol")
            funcs[gv] = f
        mod = tvm.IRModule(funcs, attrs=self.mod.attrs, global_infos=self.mod.global_infos)
        operators = tuple(
            replace(o, device="host", pattern="", partition="") if o.partition in symbols else o
            for o in self.operators
        )
        partitions = tuple(p for p in self.partitions if p.symbol not in symbols)
        return Partitioned(mod, partitions, operators, self.quantized)


def _quantized_rows(placed: Partitioned) -> list[dict[str, Any]]:
    """The report's quantized operators: where each runs and, on the host, why."""
    where = {o.name: o for o in placed.operators if o.op == "relax.quantize"}
    rows = []
    for node, kind, why, integers in placed.quantized:
        op = where.get(node)
        device = op.device if op is not None else "host"
        pattern = op.pattern if op is not None else ""
        rows.append(
            {
                "node": node,
                "kind": kind,
                "device": device,
                "pattern": pattern,
                "why": why if device == "host" else "",
                "integers": integers,
            }
        )
    return rows


@dataclass
class Compilation:
    """Everything one compile decided so far, in the order the stages decide it.

    Attributes:
        hub: the plugins and config (a :class:`umahub.Hub`).
        mod: the input module.
        placement: the pins given to ``compile(placement=...)``, or ``"auto"``
            / ``"priority"`` (how operators are placed, over the config's ``priority``).
        verify: whether the verify stage runs.
        clock: stage and hook times.
        target: the machine the model is built for and its C compiler; None:
            this machine (see :mod:`umahub.targets`).
        notes: what went differently from the plan, for the report.
        board: a :class:`umahub.boards.rpc.Board` on which placement by cost times the
            candidate groups (None: this machine).
        only: the accelerators that claim, with no pins and no auto: a cost
            measurement's build (:mod:`umahub.auto.costs`); None: as configured.
        auto: (auto) what placement by cost chose and why (:class:`umahub.auto.AutoChoice`).
        pins: (plan) every pin, in precedence order.
        planned: (plan) the patterns, in claiming order.
        partitioned: (partition) the module with its partitions; later stages
            read it; fallbacks are applied by :meth:`placed`.
        reports: (partition) per partition symbol, what happened to it.
        order: (memory) accelerator names in lowering order.
        plan: (memory) every pool's use as planned before lowering.
        needs: (memory) what each partition needs of its pool.
        lowered_plan: (lower) the plan as partitions were lowered (what hooks saw).
        modules: (lower) partition symbol -> its runtime module (a device
            partition's: its host stub).
        device_calls: (lower) symbol -> the :class:`umahub.runtime.devices.DeviceCall`
            of each partition on a device of its own.
        reference_tir: (lower) the default lowering's TIR (unscheduled) of the
            partitions whose plugin used it; the verify stage's reference.
        packers: (lower) the weights each kernel takes packed, and (build)
            their values before packing (:mod:`umahub.host.prepack`).
        devices: (build) virtual device names, index = runtime device index.
        copies: (build) the copies between devices.
        weight_devices: (build) the runtime device of each weight lifted into
            a parameter of ``main``.
        host_functions: (build) how each of the host's functions was
            scheduled, by name.
        tuned_kernels: (lower, build) each kernel the tuning database knows (the
            partitions', then the host's): name, which schedule was used
            ("tuned" or "hook") and why.
        compiled: (build) the runnable model.
        unfit: node -> {accelerator: why} of the operators an earlier try of this
            compile found do not fit that accelerator (its pool or its on-chip
            buffers): the patterns of that accelerator refuse them in this try.
        misfits: (memory, lower) the partitions of this try that do not fit their
            accelerator: ``(symbol, accelerator, nodes, why)``.
        restart: a new try of this compile with ``unfit`` given (set by the
            pipeline; None: the partitions that do not fit stay on the host).
    """

    hub: Any
    mod: tvm.IRModule
    placement: Mapping[str, str] | str | None = None
    verify: bool = False
    clock: Clock = field(default_factory=lambda: Clock(None))
    target: BuildTarget | None = None
    notes: list[str] = field(default_factory=list)
    board: Any = None
    only: tuple[Any, ...] | None = None
    auto: Any = None
    pins: Pins | None = None
    planned: list[PlannedPattern] = field(default_factory=list)
    partitioned: Partitioned | None = None
    reports: dict[str, PartitionReport] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    plan: MemoryPlan | None = None
    needs: dict[str, Need] = field(default_factory=dict)
    lowered_plan: MemoryPlan | None = None
    modules: dict[str, Any] = field(default_factory=dict)
    device_calls: dict[str, Any] = field(default_factory=dict)
    reference_tir: dict[str, Any] = field(default_factory=dict)
    packers: Packers = field(default_factory=Packers)
    devices: list[str] = field(default_factory=list)
    weight_devices: list[int] = field(default_factory=list)
    host_functions: dict[str, str] = field(default_factory=dict)
    tuned_kernels: list[dict[str, str]] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    compiled: Compiled | None = None
    unfit: dict[str, dict[str, str]] = field(default_factory=dict)
    misfits: list[tuple[str, str, tuple[str, ...], str]] = field(default_factory=list)
    restart: Callable[[dict[str, dict[str, str]]], Compilation] | None = None

    @property
    def config(self) -> Any:
        """The hub's validated ``[tool.umahub]``."""
        return self.hub.config

    @property
    def foreign(self) -> bool:
        """Whether the model is built for another architecture (it cannot run here)."""
        return self.target is not None and not self.target.native

    # ------------------------------------------------------------------ on-error

    def fail(
        self,
        message: str,
        error: type = CompileError,
        cause: BaseException | None = None,
        then: str = "",
    ) -> str:
        """A failure that ``on-error`` decides: raise ``error``, or warn and note it.

        ``then`` says in the warning what happens instead (``"'npu' claims
        nothing in this compile"``). Returns the message when the compile goes on.
        """
        if self.config.on_error == "error":
            raise error(message) from cause
        warn(f"{message}; {then}" if then else message, cause)
        self.notes.append(message)
        return message

    def fall_back(self, symbol: str, message: str, error: type = CompileError, cause=None) -> None:
        """A partition's failure: it goes back to the host (or the compile stops)."""
        self.reports[symbol].fallback = self.fail(
            message, error, cause, then="its partition runs on the host"
        )

    def does_not_fit(self, symbol: str, message: str, error: type = CompileError) -> None:
        """Partition ``symbol`` does not fit its accelerator's pool or on-chip buffers.

        With ``on-error = "error"`` the compile stops. Otherwise its operators
        are kept in :attr:`misfits`, and the pipeline places the model again
        with that accelerator's patterns refusing them: the next claimant in
        priority order takes them where it fits them, else the host
        (:mod:`umahub.compiler.refit`).
        """
        if self.config.on_error == "error":
            raise error(message)
        partitions = written(self.partitioned, "partitioned").partitions
        part = next(p for p in partitions if p.symbol == symbol)
        nodes = tuple(dict.fromkeys(op.name for op in part.operators))
        self.misfits.append((symbol, part.accelerator, nodes, message))
        self.reports[symbol].fallback = message

    def refused(self, symbol: str, message: str) -> None:
        """A partition its plugin refused while lowering it (``umahub.plugin.Unsupported``):
        it goes back to the host, noted in the report; a decision, not a failure, so
        ``on-error`` does not apply."""
        self.reports[symbol].fallback = message
        self.notes.append(message)

    @property
    def fallen(self) -> set[str]:
        """Symbols of the partitions that went back to the host."""
        return {s for s, r in self.reports.items() if r.fallback}

    def placed(self) -> Partitioned:
        """The partitioned module with every fallback applied."""
        assert self.partitioned is not None
        return self.partitioned.to_host(self.fallen)

    def functions(self) -> dict[str, relax.Function]:
        """symbol -> Relax function of every partition (fallen back or not), carrying
        the small constants the model passes it (:func:`with_constant_inputs`)."""
        assert self.partitioned is not None
        mod = self.partitioned.mod
        constants = partition_constants(mod, CONSTANT_LIMIT)
        return {
            symbol: with_constant_inputs(func, constants.get(symbol, {}))
            for symbol, func in partition_functions(mod).items()
        }

    # ------------------------------------------------------------------ the report

    def report(self, built: bool = True) -> Report:
        """The report of this compilation, derived from its state."""
        placed = self.placed()
        return Report(
            list(placed.operators),
            list(self.reports.values()),
            self.devices,
            self.copies,
            self.lowered_plan if built else self.plan,
            self.clock.stages,
            self.clock.hooks,
            self.notes,
            built=built,
            host_schedules=dict(sorted(Counter(self.host_functions.values()).items())),
            host_unscheduled=sorted(
                name for name, how in self.host_functions.items() if how == "unscheduled"
            ),
            tuned_kernels=self.tuned_kernels,
            auto=self.auto.to_dict() if self.auto is not None else None,
            quantized=_quantized_rows(placed),
            options=self.hub.changed_options(),
        )

    @property
    def placing_by_cost(self) -> bool:
        """Whether placement is chosen by cost: ``placement="auto"``, or ``priority =
        "auto"`` in the config and not ``placement="priority"``; never for a measurement."""
        if self.only is not None:
            return False
        if isinstance(self.placement, str):
            return self.placement == "auto"
        return bool(getattr(self.config, "placement_auto", False))
