"""Where a candidate group's seconds come from: a plugin's cost model, the cache, a measurement.

In that order:

1. ``umahub_cost`` (:func:`umahub.plugin.hookspecs.umahub_cost`): a vendor's estimate;
2. the cost cache (:mod:`umahub.auto.cache`): what an earlier compile measured;
3. a measurement: the group alone (its Relax function, weights bound) is built
   by :func:`umahub.compiler.pipeline.build_alone` with its accelerator alone claiming,
   and with no accelerator at all for the host's side, then run on this
   machine, on the VM (whose thread pool the kernels share, as when the
   model runs). The accelerator's seconds are its partition's call, timed by
   TVM's VM instrumentation (the copies in and out are timed as calls of
   their own, and feed the copy model); the host's are the whole run.
   With a board (``compile(..., board=umahub.remote(...))``), the group's
   library is exported and run there instead, and its seconds are ``main``'s
   on the board, its own copies included.

A measurement keeps the fastest of its runs: what the group costs when the
machine leaves it alone. It is cached for good, so a median taken while
another job loaded the machine would mislead every later compile.

Each timed run starts with this core's own caches written over
(:func:`evict_caches`), as the group finds them in the model: between two
inferences the rest of the model has run, and the group's weights come back
from the shared cache or memory, where a group run again and again alone
finds them in its core's cache. Its inputs are warm again once its copies
in have run, as in the model.

Equal groups (same operators, shapes and pattern) are costed once. A group
that cannot be measured (a size known only at run time, a model built for
another machine, a build that fails or places the group elsewhere) has no
cost; the search then leaves it where ``priority`` puts it. A board's
measurements are cached apart from this machine's (the key holds the board's
architecture, CPU and core count).

Copies: a pool that declares its ``bandwidth`` is costed from it; otherwise
the copies the measurements timed are fitted as ``latency + bytes /
bandwidth`` per accelerator; with nothing timed, from a host ``memcpy`` timed
once.

Why this module is long: a group's cost and the copy model are fed by the
same measurements (a group's run times its copies too) and keyed alike (the
versions, code, target, threads and CPU of one compile); apart, each would
reach into the other's state.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from umahub.auto.cache import CostCache, code_fingerprint, digest
from umahub.auto.candidates import Group
from umahub.config import HOST
from umahub.errors import CompileError, PluginFailure, message_line
from umahub.hub.timelimit import within
from umahub.hub.tracing import recording, returned_by
from umahub.plugin.context import CostContext, Operator

__all__ = ["CopyModel", "Cost", "Costs", "evict_caches", "private_cache_bytes"]

#: Copies of fewer bytes tell a copy's latency, not the bandwidth (see ``_fit``).
BANDWIDTH_BYTES = 64 << 10
#: A measurement runs at least this many times, and more until about SECONDS.
RUNS = 5
SECONDS = 0.02
MAX_RUNS = 50


@dataclass(frozen=True)
class Cost:
    """Seconds of a group on one device, and where the number came from.

    ``source``: ``"plugin <name>"`` (its ``umahub_cost``), ``"measured"``,
    ``"cached"`` (measured by an earlier compile), or ``""`` with ``why``
    saying why there is no number.
    """

    seconds: float | None
    source: str
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {"seconds": self.seconds, "source": self.source}
        if self.why:
            out["why"] = self.why
        return out


@dataclass
class CopyModel:
    """Seconds of a copy: ``latency + bytes / bandwidth`` per accelerator end of the copy."""

    latency: dict[str, float] = field(default_factory=dict)
    bandwidth: dict[str, float] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    def seconds(self, src: str, dst: str, size: int) -> float:
        """Seconds to copy ``size`` bytes from device ``src`` to ``dst`` (names, or "host")."""
        total = 0.0
        for accel in {src, dst} - {HOST}:  # between two accelerators: through the host
            total += self.latency.get(accel, 0.0) + size / self.bandwidth.get(
                accel, self.bandwidth.get(HOST, 1e10)
            )
        return total

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: per accelerator, microseconds of latency and GB/s."""
        return {
            accel: {
                "latency_us": round(self.latency.get(accel, 0.0) * 1e6, 3),
                "gb_per_s": round(bw / 1e9, 3),
                "source": self.source.get(accel, ""),
            }
            for accel, bw in self.bandwidth.items()
        }


def _host_memcpy_bandwidth() -> float:
    """Bytes per second of a large copy on this machine (timed once)."""
    a = np.ones(1 << 21, dtype="float32")  # 8 MiB
    b = np.empty_like(a)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - start)
    return a.nbytes / max(best, 1e-9)


def _fit(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(latency, bandwidth) of ``seconds = latency + bytes / bandwidth`` over the samples.

    The latency is what the smallest copies take (a fixed cost: a call, a thread
    handing over); the bandwidth, the median of what the copies of at least
    :data:`BANDWIDTH_BYTES` move beyond it. A least-squares line would let a few
    large, noisy copies set the latency, even below zero; and a copy of a few
    kilobytes moves them in a fraction of the latency's own noise: its "rate"
    measures the noise (a DSP's copies of at most 4 KiB once gave 0.08 GB/s,
    and every large copy to it was then costed at that). Without a large copy
    the bandwidth is unknown (``inf``; the caller takes a host memcpy's).
    """
    ordered = sorted(samples)
    small = [t for _, t in ordered[: max(1, len(ordered) // 4)]]
    latency = float(np.median(small))
    rates = [s / (t - latency) for s, t in ordered if s >= BANDWIDTH_BYTES and t > latency * 1.5]
    return latency, float(np.median(rates)) if rates else math.inf


def _more_runs(times: Sequence[float]) -> int:
    """How many more runs a measurement of ``RUNS`` runs that took ``times`` needs to
    last about ``SECONDS`` in all, at most ``MAX_RUNS``; 0 when it lasted that long."""
    median = statistics.median(times)
    if median * RUNS >= SECONDS:
        return 0
    return min(MAX_RUNS, int(SECONDS / max(median, 1e-7)))


def private_cache_bytes(caches: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The largest cache of this machine's first core that it does not share (its L2 on
    most CPUs), from Linux's sysfs (``caches``); 2 MiB where that does not say."""
    import glob

    sizes = []
    for index in glob.glob(f"{caches}/index*"):
        try:
            with open(f"{index}/shared_cpu_list") as f:
                shared = f.read().strip()
            with open(f"{index}/size") as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        if not shared.isdigit():  # "0-1", "0,2": shared with another core
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=2 << 20)


_EVICTION: list[np.ndarray] = []


def evict_caches() -> None:
    """Write over twice :func:`private_cache_bytes` of memory: what this core's own
    caches held is gone, as after the rest of a model has run."""
    if not _EVICTION:
        _EVICTION.append(np.zeros(2 * private_cache_bytes(), dtype=np.uint8))
    _EVICTION[0] += 1


def _threads() -> str:
    return os.environ.get("TVM_NUM_THREADS") or str(os.cpu_count() or 1)


def _this_cpu() -> str:
    """This machine's CPU as a cost depends on it: LLVM's name for it (what the kernels
    are built for: ``znver3``, ``sapphirerapids``) and the model the kernel reports."""
    from umahub.boards.bench import machine_info
    from umahub.targets import host_target

    return f"{host_target().get('mcpu', 'generic')} {machine_info().get('cpu', '')}".strip()


class Costs:
    """The costs of one compile's candidate groups (see the module's documentation)."""

    def __init__(self, comp: Any, build: Any, cache: CostCache | None = None):
        """``build(hub, mod, accelerators, target) -> Compiled`` builds a group alone
        (:func:`umahub.compiler.pipeline.build_alone`)."""
        import tvm

        import umahub

        self.comp = comp
        self.build = build
        self.hub = comp.hub
        self.cache = cache if cache is not None else CostCache()
        self.board = comp.board
        self.measurable = self.board is not None or not comp.foreign
        plugins = sorted(
            f"{p.name}={p.distribution}:{p.version}" for p in self.hub.plugins if p.loaded
        )
        target = comp.target.text if comp.target is not None else "this machine"
        where = (
            "board {machine} {cpu} x{cpus}".format_map(
                {"machine": "?", "cpu": "", "cpus": "?", **self.board.info}
            )
            if self.board is not None
            else f"{_threads()} threads, {_this_cpu()}"
        )
        code = code_fingerprint([umahub] + [p.obj for p in self.hub.plugins if p.loaded])
        self._base = (umahub.__version__, tvm.__version__, plugins, code, target, where)
        # Backend options change what an accelerator's code does: a group's cost depends on
        # its accelerator's, a verdict on the whole model on every accelerator's. Added only
        # where there are options, so that the keys of the others stay as they were.
        self._options = {
            a.name: ";".join(f"{k}={v!r}" for k, v in sorted(self.hub.options_of(a.name).items()))
            for a in self.hub.accelerators
            if self.hub.options_of(a.name)
        }
        self._seen: dict[tuple[str, str], Cost] = {}
        self.copy_samples: dict[str, list[tuple[int, float]]] = {}
        self.counts = {"plugin": 0, "measured": 0, "cached": 0, "none": 0}
        self.failures: list[str] = []

    @property
    def base(self) -> tuple[Any, ...]:
        """What every cost of this compile depends on (versions, code, target, threads,
        the backend options of every accelerator that has some)."""
        return self._base + tuple(f"{a}:{o}" for a, o in sorted(self._options.items()))

    def _key(self, device: str, key: str) -> str:
        """The cache key of a group's cost on ``device`` (an accelerator's, or the host)."""
        options = self._options.get(device)
        return digest(*self._base, device, key, *([options] if options else []))

    # ------------------------------------------------------------------ groups

    def of(self, group: Group, operators: Sequence[Operator]) -> Cost:
        """The group's seconds on its accelerator."""
        memo = (group.accelerator, group.key)
        if memo not in self._seen:
            cost = self._from_hook(group, operators)
            if cost is None:
                cost = self._measured(group, group.accelerator, group.key)
            self._seen[memo] = cost
        return self._seen[memo]

    def on_host(self, group: Group) -> Cost:
        """The seconds of the group's operators on the host."""
        memo = (HOST, group.host_key)
        if memo not in self._seen:
            self._seen[memo] = self._measured(group, HOST, group.host_key)
        return self._seen[memo]

    def _from_hook(self, group: Group, operators: Sequence[Operator]) -> Cost | None:
        comp, hub = self.comp, self.hub
        acc = hub.accelerator(group.accelerator)
        context = CostContext(
            comp.config,
            acc,
            tuple(operators),
            group.patterns,
            comp.target.tvm() if comp.target is not None else None,
            hub.options_of(acc.name),
        )

        def ask() -> tuple[Any, list[str]]:
            with recording():
                value = hub.traced_hook.umahub_cost(
                    accelerator=acc, function=group.function, context=context
                )
                return value, returned_by("umahub_cost", 1)

        try:
            value, giver = within(comp.config.hook_timeout, ask, f"cost of {group.nodes[0]}")
        except Exception as exc:
            failure = PluginFailure.of(exc, hub.owner(acc.name), "umahub_cost")
            cause = failure.cause
            what = f"{type(cause).__name__}: {message_line(cause)}"
            self._plugin_failed(failure.plugin, group, what, cause)
            return None
        if value is None:
            return None
        plugin = giver[0] if giver else hub.owner(acc.name)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= float(value) < math.inf
        ):
            self._plugin_failed(
                plugin, group, f"it returned {value!r}, not a finite number of seconds >= 0"
            )
            return None
        self.counts["plugin"] += 1
        return Cost(float(value), f"plugin {plugin}")

    def _plugin_failed(
        self, plugin: str, group: Group, what: str, exc: BaseException | None = None
    ) -> None:
        message = (
            f"plugin '{plugin}' failed in umahub_cost for accelerator '{group.accelerator}' "
            f"on {', '.join(group.nodes[:3])}{' ...' if len(group.nodes) > 3 else ''}: {what}"
        )
        self.failures.append(message)
        self.comp.fail(message, CompileError, exc, then="the group is measured instead")

    def _measured(self, group: Group, device: str, key: str) -> Cost:
        if not group.static:
            self.counts["none"] += 1
            return Cost(None, "", "a size of it is known only at run time")
        if not self.measurable:
            self.counts["none"] += 1
            return Cost(
                None,
                "",
                "the model is built for another machine: nothing to time here (give a board)",
            )
        cache_key = self._key(device, key)
        hit = self.cache.get(cache_key)
        if isinstance(hit, dict) and isinstance(hit.get("seconds"), (int, float)):
            self._add_copies(hit.get("copies", ()))
            self.counts["cached"] += 1
            return Cost(float(hit["seconds"]), "cached")
        try:
            seconds, copies = self._time(group, device)
        except _NotPlaced as exc:
            self.counts["none"] += 1
            return Cost(None, "", str(exc))
        except Exception as exc:  # a group that cannot be built alone: no number, no failure
            self.counts["none"] += 1
            why = f"building it alone failed: {type(exc).__name__}: {message_line(exc)}"
            return Cost(None, "", why)
        self.cache.put(cache_key, {"seconds": seconds, "copies": copies})
        self._add_copies(copies)
        self.counts["measured"] += 1
        return Cost(seconds, "measured")

    def _time(self, group: Group, device: str) -> tuple[float, list[list[Any]]]:
        import tvm

        from umahub.runtime.compiled import example_inputs

        only = [] if device == HOST else [self.hub.accelerator(device)]
        mod = tvm.IRModule({"main": group.function})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = self.build(self.hub, mod, only, self.comp.target)
        report = compiled.report
        if device != HOST:
            placed = [p for p in report.partitions if not p.fallback]
            if len(placed) != 1 or any(o.device == HOST for o in report.placement):
                raise _NotPlaced(
                    f"its patterns did not take the group alone ({len(placed)} partition(s))"
                )
        arrays = example_inputs(compiled.input_info)
        if self.board is not None:
            return self._time_on_board(compiled, arrays), []
        runner = compiled._executors
        if device == HOST:
            times = runner.step_seconds(arrays, RUNS, evict_caches)["main"]
            if more := _more_runs(times):
                times += runner.step_seconds(arrays, more, evict_caches)["main"]
            return min(times), []
        # On the VM, whose thread pool the kernels share as when the model runs (the
        # concurrent executor gives an emulated accelerator's kernels one thread).
        symbol = placed[0].symbol
        calls, copied = runner.call_seconds(arrays, RUNS, evict_caches)
        if more := _more_runs(calls[symbol]):
            again, copied_again = runner.call_seconds(arrays, more, evict_caches)
            calls[symbol] += again[symbol]
            copied += copied_again
        copies = [[device, size, seconds] for size, seconds in copied if size]
        return min(calls[symbol]), copies

    def _time_on_board(self, compiled: Any, arrays: Sequence[Any]) -> float:
        """Median seconds of the group's whole library on the board (its copies included)."""
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(prefix="umahub-cost-") as tmp:
            model = self.board.load(compiled.export_library(Path(tmp) / "group.so"))
        model.run(*arrays)
        times = []
        for _ in range(RUNS):
            model.run(*arrays)
            times.append(model.board_seconds())
        return min(times)

    # ------------------------------------------------------------------ copies

    def _add_copies(self, copies: Any) -> None:
        for item in copies or ():
            try:
                accel, size, seconds = item
                self.copy_samples.setdefault(str(accel), []).append((int(size), float(seconds)))
            except (TypeError, ValueError):
                continue  # an entry of a damaged cache: ignored

    def copy_model(self, accelerators: Sequence[Any]) -> CopyModel:
        """The copy model: declared bandwidths, else fitted measurements, else memcpy."""
        model = CopyModel()
        memcpy: float | None = None
        for acc in accelerators:
            pool = acc.pool
            if pool is not None and pool.bandwidth:
                model.bandwidth[acc.name] = float(pool.bandwidth)
                model.source[acc.name] = f"declared by pool {pool.scope}"
            elif len(self.copy_samples.get(acc.name, ())) >= 1:
                latency, bandwidth = _fit(self.copy_samples[acc.name])
                timed = len(self.copy_samples[acc.name])
                model.latency[acc.name] = latency
                model.source[acc.name] = f"fitted to {timed} timed copies"
                if bandwidth == math.inf:  # only small copies timed: the latency is all they tell
                    memcpy = memcpy or _host_memcpy_bandwidth()
                    bandwidth = memcpy
                    model.source[acc.name] += ", bandwidth of a host memcpy"
                model.bandwidth[acc.name] = bandwidth
            else:
                memcpy = memcpy or _host_memcpy_bandwidth()
                model.bandwidth[acc.name] = memcpy
                model.source[acc.name] = "host memcpy, timed"
        return model


class _NotPlaced(Exception):
    """A group built alone did not land on its accelerator."""
