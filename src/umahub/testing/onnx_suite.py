"""The ONNX backend node tests, through plain TVM and through umahub.

The ``onnx`` wheel ships the generators of its backend node tests
(``onnx.backend.test.case.node``), not their data: this module generates the
cases in memory (a model, inputs and expected outputs each), keeps those whose
inputs and outputs are all tensors (no sequences, optionals or maps), and runs
each one in up to three configurations:

``plain``
    ``tvm.relax.frontend.onnx.from_onnx`` then ``tvm.compile(target="llvm")`` on
    ``relax.VirtualMachine``: what TVM does without umahub.
``umahub``
    the model imported by umahub's ``umahub.frontends.from_onnx`` (TVM's
    importer, with the operators named and the quantized operator forms
    rewritten into QDQ, so it imports QLinearConv, QLinearMatMul and
    ConvInteger where TVM alone does not), compiled by ``umahub.Hub(config={...},
    project_config=False)`` with the installed plugins (by default only the
    bundled ``npu``, ``vanilla`` and ``dsp``) and the default configuration.
``pins``
    the same hub, every operator of ``main`` pinned at random (seeded by the
    case's name, so a rerun pins the same way) to one of :data:`PIN_DEVICES`.

Outputs are compared with the case's ``rtol``/``atol`` (else the ONNX backend's
defaults, 1e-3 and 1e-7); dtypes and shapes must match and NaN must sit where
the expected output has NaN. The outcome of a case in a configuration is one of
:data:`OUTCOMES`. A *regression* is a case that plain TVM gets right and umahub
(or the pinned hub) does not: umahub must never be worse than plain TVM.

Every case runs in a worker process (``--jobs``, default 1) with a timeout per
configuration, so that a segfault or a hang inside TVM is recorded as
``crash`` or ``timeout`` and the worker is replaced. Plain-TVM results do not
depend on umahub: ``--reuse-plain [FILE]`` takes them from an earlier results
file, so a rerun after a umahub fix compiles only the umahub configurations.

Run it::

    python -m umahub.testing.onnx_suite                      # all cases, all configurations
    python -m umahub.testing.onnx_suite -k conv --configs plain,umahub
    python -m umahub.testing.onnx_suite --reuse-plain --list-regressions

The results go to ``suites/results/onnx_suite.json`` (``--out``): the machine,
the umahub, TVM, onnx and Python versions, every case's outcomes and a
summary. The last line printed is the summary, ``onnx-suite: <n> cases,
plain ok <n>, umahub ok <n>, pins ok <n>, regressions <n> (umahub) <n>
(pins)``; the exit status is 1 when there is a regression, else 0.

From Python (a vendor's own tests)::

    from umahub.testing import onnx_suite

    hub = onnx_suite.make_hub()
    case = onnx_suite.load_cases(names=["test_relu"])[0]
    result = onnx_suite.run_case(case, "umahub", hub=hub)
    assert result.outcome == "ok", result.detail

The module needs from umahub only ``umahub.Hub``, ``Hub.compile(mod,
placement=...)`` and ``Compiled.run``, so it can also check an older umahub
(``PYTHONPATH=<old checkout>/src python path/to/onnx_suite.py``).

Why this module is long: it runs as one file, also by path against an older
umahub checkout (to measure before and after a change), so it cannot be split
into modules that the older checkout does not have.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import multiprocessing
import os
import platform
import random
import sys
import time
import traceback
import warnings
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIGS",
    "DEFAULT_ATOL",
    "DEFAULT_PLUGINS",
    "DEFAULT_RTOL",
    "OUTCOMES",
    "PIN_DEVICES",
    "Case",
    "Result",
    "compare_outputs",
    "is_regression",
    "load_cases",
    "main",
    "make_hub",
    "operator_nodes",
    "random_pins",
    "run_case",
    "run_suite",
    "summary_line",
]

#: The configurations a case runs in, in this order.
CONFIGS: tuple[str, ...] = ("plain", "umahub", "pins")

#: What a case can come to in one configuration.
#: ``import-error`` is plain TVM's ``from_onnx`` failing; the umahub
#: configurations of such a case are ``not-importable`` when umahub's import
#: fails too (umahub is not at fault), and an umahub import that fails where
#: TVM's succeeds is an ``error``.
OUTCOMES: tuple[str, ...] = (
    "ok",
    "wrong",
    "error",
    "crash",
    "timeout",
    "import-error",
    "not-importable",
)

#: The ONNX backend test's default tolerances.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

#: The plugins the hub loads by default: the three bundled with umahub.
DEFAULT_PLUGINS: tuple[str, ...] = ("npu", "vanilla", "dsp")

#: The devices the ``pins`` configuration draws from, one per operator.
PIN_DEVICES: tuple[str, ...] = ("npu", "vanilla_accel", "dsp_cpu:0", "dsp_cpu:1", "host")

DEFAULT_OUT = Path("suites/results/onnx_suite.json")
DEFAULT_TIMEOUT = 120.0


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One ONNX node test: a model, its data sets and tolerances.

    ``data_sets`` is a list of ``(inputs, expected_outputs)``, each a list of
    numpy arrays in the order of the graph's inputs and outputs.
    """

    name: str
    model_bytes: bytes
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    op_type: str = ""

    def __repr__(self) -> str:
        return f"Case({self.name!r}, op_type={self.op_type!r}, data_sets={len(self.data_sets)})"

    @property
    def model(self) -> Any:
        """The ``onnx.ModelProto`` (parsed anew on each access)."""
        import onnx

        return onnx.load_from_string(self.model_bytes)

    @property
    def opset(self) -> int | None:
        """The model's opset of the default ONNX domain."""
        for imp in self.model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return int(imp.version)
        return None


@dataclass
class Result:
    """The outcome of one case in one configuration.

    ``detail`` is the error's type and last line, or what differs for a
    ``wrong`` result; ``max_abs_err`` the largest absolute difference of a
    ``wrong`` result (None when not a number: NaN positions, shapes, dtypes);
    ``pins`` the placement of the ``pins`` configuration.
    """

    outcome: str
    detail: str = ""
    max_abs_err: float | None = None
    seconds: float = 0.0
    pins: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (fields that are empty left out)."""
        out = {k: v for k, v in asdict(self).items() if v not in (None, "", {})}
        out["seconds"] = round(self.seconds, 3)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        """The inverse of :meth:`to_json`."""
        return cls(
            **{
                k: data[k]
                for k in ("outcome", "detail", "max_abs_err", "seconds", "pins")
                if k in data
            }
        )


def _is_tensor_case(tc: Any) -> bool:
    graph = tc.model.graph
    for vi in list(graph.input) + list(graph.output):
        if vi.type.WhichOneof("value") != "tensor_type":
            return False
    import numpy as np

    for inputs, outputs in tc.data_sets:
        for value in list(inputs) + list(outputs):
            if not isinstance(value, (np.ndarray, np.generic)):  # a numpy scalar is a 0-d tensor
                return False
    return bool(tc.data_sets)


def _op_type(tc: Any) -> str:
    """The operator a case tests: its one node's, or the nodes' of an expanded function."""
    nodes = tc.model.graph.node
    types = list(dict.fromkeys(n.op_type for n in nodes))
    return types[0] if len(types) == 1 else "+".join(types[:4]) + ("+..." if len(types) > 4 else "")


def load_cases(
    substring: str | None = None,
    names: Iterable[str] | None = None,
    *,
    modules: Iterable[str] | None = None,
    skipped: list[str] | None = None,
) -> list[Case]:
    """The tensor-only ONNX node test cases, generated in memory, sorted by name.

    Args:
        substring: keep the cases whose name contains it (``-k``); ``*``, ``?``
            and ``[`` make it a glob on the whole name.
        names: keep only these cases (exact names).
        modules: generate only the cases of these generator modules of
            ``onnx.backend.test.case.node`` (``"conv"``, ``"clip"``, ...), much
            faster than generating all of them (each case's data is the same
            either way: the generators seed numpy before each export).
        skipped: receives the names of the cases left out because an input or
            output is not a tensor.
    """
    import importlib

    import numpy as np
    from onnx.backend.test.case import node as node_cases

    wanted = set(names) if names is not None else None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if modules is None:
            found = list(node_cases.collect_testcases(None))
        else:
            for module in modules:
                importlib.import_module(f"{node_cases.__name__}.{module}")
            found = list(node_cases._NodeTestCases)
    cases: dict[str, Case] = {}
    for tc in found:
        if wanted is not None and tc.name not in wanted:
            continue
        if substring and not _selects(substring, tc.name):
            continue
        if tc.name in cases:
            continue
        if tc.model is None or tc.data_sets is None or not _is_tensor_case(tc):
            if skipped is not None:
                skipped.append(tc.name)
            continue
        cases[tc.name] = Case(
            name=tc.name,
            model_bytes=tc.model.SerializeToString(),
            data_sets=[
                ([np.asarray(x) for x in i], [np.asarray(x) for x in o]) for i, o in tc.data_sets
            ],
            rtol=DEFAULT_RTOL if tc.rtol is None else float(tc.rtol),
            atol=DEFAULT_ATOL if tc.atol is None else float(tc.atol),
            op_type=_op_type(tc),
        )
    return [cases[n] for n in sorted(cases)]


def _selects(substring: str, name: str) -> bool:
    if any(ch in substring for ch in "*?["):
        return fnmatch.fnmatchcase(name, substring)
    return substring in name


# --------------------------------------------------------------------------- comparing


def compare_outputs(
    actual: Sequence[Any],
    expected: Sequence[Any],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> Result:
    """Compare outputs as the ONNX backend test does; ``ok`` or ``wrong``.

    Counts, dtypes and shapes must match; NaN must be where the expected output
    has NaN, infinities equal; the rest within ``atol + rtol * |expected|``.
    Strings and booleans must be equal.
    """
    import numpy as np

    if len(actual) != len(expected):
        return Result("wrong", f"{len(actual)} outputs, expected {len(expected)}")
    worst: float | None = 0.0
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a)
        e = np.asarray(e)
        if a.dtype != e.dtype:
            return Result("wrong", f"output {i}: dtype {a.dtype}, expected {e.dtype}")
        if a.shape != e.shape:
            return Result("wrong", f"output {i}: shape {a.shape}, expected {e.shape}")
        if e.dtype.kind in "OSUb":
            if not np.array_equal(a, e):
                bad = int(np.sum(a != e))
                return Result("wrong", f"output {i}: {bad} of {e.size} elements differ", None)
            continue
        af = a.astype(np.float64)
        ef = e.astype(np.float64)
        a_nan, e_nan = np.isnan(af), np.isnan(ef)
        if not np.array_equal(a_nan, e_nan):
            bad = int(np.sum(a_nan != e_nan))
            return Result("wrong", f"output {i}: NaN at {bad} positions that differ", None)
        a_inf, e_inf = np.isinf(af), np.isinf(ef)
        if not np.array_equal(af[a_inf | e_inf], ef[a_inf | e_inf]):
            return Result("wrong", f"output {i}: infinities differ", None)
        finite = ~(e_nan | e_inf)
        if not finite.any():
            continue
        diff = np.abs(af[finite] - ef[finite])
        err = float(diff.max())
        worst = max(worst, err) if worst is not None else worst
        if np.any(diff > atol + rtol * np.abs(ef[finite])):
            bad = int(np.sum(diff > atol + rtol * np.abs(ef[finite])))
            return Result(
                "wrong",
                f"output {i}: {bad} of {e.size} elements differ, max abs error {err:.3g}",
                err,
            )
    return Result("ok", max_abs_err=worst if worst else None)


def _to_numpy(value: Any) -> list[Any]:
    """A VM's (or a compiled model's) return value as a flat list of numpy arrays."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return [value]
    if hasattr(value, "numpy"):
        return [value.numpy()]
    if isinstance(value, (int, float, bool, np.generic)):
        return [np.asarray(value)]
    if type(value).__name__ in ("Shape", "ShapeTuple"):  # an R.shape output: ONNX says int64
        return [np.asarray(list(value), dtype="int64")]
    try:
        items = list(value)
    except TypeError:
        return [np.asarray(value)]
    if items and all(isinstance(x, (int, np.integer)) for x in items):
        return [np.asarray(items, dtype="int64")]  # a shape, as a plain sequence
    out: list[Any] = []
    for item in items:
        out.extend(_to_numpy(item))
    return out


def _error(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:500]


# --------------------------------------------------------------------------- running


def make_hub(plugins: Sequence[str] | None = DEFAULT_PLUGINS) -> Any:
    """A hub with the given installed plugins (None: all) and otherwise the default config.

    The project's ``[tool.umahub]`` is not read (``project_config=False``).
    """
    import umahub

    config: dict[str, Any] = {}
    if plugins is not None:
        config["plugins"] = list(plugins)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return umahub.Hub(config=config, project_config=False)


def _import(case: Case) -> Any:
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(case.model, opset=case.opset, keep_params_in_input=False)


def _import_umahub(case: Case) -> Any:
    """The case's model through umahub's ONNX import (TVM's, for an umahub without one).

    umahub's import is TVM's with the operators named and the quantized
    operator forms rewritten (QLinearConv, ...), so a case plain TVM cannot
    import may still run through umahub.
    """
    try:
        from umahub.frontends import from_onnx
    except ImportError:
        return _import(case)
    return from_onnx(case.model)


def _node_name(binding: Any) -> str:
    """The name pins match for the operator a binding computes.

    umahub's own function where this umahub has one (it has moved between
    versions), else the same rule: the call's span names the node, else the
    bound variable's name.
    """
    import importlib

    for module in ("umahub.ir", "umahub.partition"):
        try:
            return importlib.import_module(module).node_name(binding)
        except (ImportError, AttributeError):
            continue
    span = binding.value.span
    if span is not None and getattr(span, "source_name", None) is not None:
        return str(span.source_name.name)
    var = binding.var
    hint = getattr(var, "name_hint", None)
    return str(hint if hint is not None else var.name)


def operator_nodes(mod: Any) -> list[str]:
    """The node names of the operator calls in ``mod["main"]``, in order, as pins see them."""
    import tvm
    from tvm import relax

    names: list[str] = []
    body = mod["main"].body
    if not isinstance(body, relax.SeqExpr):
        return names
    for block in body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = _node_name(binding)
                if name not in names:
                    names.append(name)
    return names


def random_pins(
    name: str, nodes: Sequence[str], devices: Sequence[str] = PIN_DEVICES
) -> dict[str, str]:
    """Each node pinned to one of ``devices``, drawn by a generator seeded with ``name``."""
    rng = random.Random(zlib.crc32(name.encode()))
    return {node: rng.choice(list(devices)) for node in nodes}


def _run_plain(mod: Any, inputs: list[Any]) -> list[Any]:
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return _to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in inputs]))


def run_case(
    case: Case,
    config: str,
    hub: Any = None,
    *,
    pin_devices: Sequence[str] = PIN_DEVICES,
) -> Result:
    """Run ``case`` in ``config`` (one of :data:`CONFIGS`) in this process.

    ``hub`` is used by the umahub configurations (default: :func:`make_hub`).
    A crash or hang is not caught here: :func:`run_suite` runs cases in worker
    processes for that.
    """
    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}: one of {', '.join(CONFIGS)}")
    start = time.perf_counter()
    pins: dict[str, str] | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mod = _import(case) if config == "plain" else _import_umahub(case)
        except Exception as exc:
            outcome = "import-error" if config == "plain" else _umahub_import_failure(case)
            return Result(outcome, _error(exc), seconds=time.perf_counter() - start)
        try:
            if config == "plain":
                run = lambda inputs: _run_plain(mod, inputs)  # noqa: E731
            else:
                if hub is None:
                    hub = make_hub()
                if config == "pins":
                    pins = random_pins(case.name, operator_nodes(mod), pin_devices)
                    compiled = hub.compile(mod, placement=pins)
                else:
                    compiled = hub.compile(mod)
                run = lambda inputs: _to_numpy(compiled.run(*inputs))  # noqa: E731
            result = Result("ok")
            for inputs, expected in case.data_sets:
                result = compare_outputs(run(inputs), expected, case.rtol, case.atol)
                if result.outcome != "ok":
                    break
        except Exception as exc:
            result = Result("error", _error(exc))
    result.seconds = time.perf_counter() - start
    result.pins = pins
    return result


def _umahub_import_failure(case: Case) -> str:
    """``not-importable`` when plain TVM cannot import the case either, else ``error``."""
    try:
        _import(case)
    except Exception:
        return "not-importable"
    return "error"


def is_regression(plain: Result | str | None, other: Result | str | None) -> bool:
    """Plain TVM got the case right and the other configuration did not."""
    p = plain.outcome if isinstance(plain, Result) else plain
    o = other.outcome if isinstance(other, Result) else other
    return p == "ok" and o is not None and o != "ok"


# --------------------------------------------------------------------------- workers


def _worker(conn: Any, plugins: Sequence[str] | None, pin_devices: Sequence[str]) -> None:
    """A worker process: make one hub, then run ``(case, configs)`` tasks until None."""
    warnings.simplefilter("ignore")
    try:
        import tvm

        import umahub

        hub = make_hub(plugins)
        conn.send(("ready", {"umahub_file": umahub.__file__, "tvm_file": tvm.__file__}))
    except Exception as exc:
        conn.send(("failed", _error(exc) + "\n" + traceback.format_exc()))
        return
    while True:
        task = conn.recv()
        if task is None:
            return
        case, configs = task
        for config in configs:
            result = run_case(case, config, hub, pin_devices=pin_devices)
            conn.send(("result", case.name, config, result))
        conn.send(("done", case.name))


@dataclass
class _Slot:
    process: Any = None
    conn: Any = None
    ready: bool = False
    case: Case | None = None
    remaining: list[str] = field(default_factory=list)
    deadline: float = 0.0


class _Pool:
    """Worker processes, each running one case at a time, replaced after a crash."""

    def __init__(self, jobs: int, timeout: float, plugins: Any, pin_devices: Sequence[str]):
        self.ctx = multiprocessing.get_context("spawn")
        self.timeout = timeout
        self.args = (plugins, tuple(pin_devices))
        self.slots = [_Slot() for _ in range(max(1, jobs))]
        self.info: dict[str, Any] = {}
        for slot in self.slots:
            self._start(slot)

    def _start(self, slot: _Slot) -> None:
        parent, child = self.ctx.Pipe()
        slot.process = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        slot.process.start()
        child.close()
        slot.conn, slot.ready, slot.case, slot.remaining = parent, False, None, []
        slot.deadline = time.monotonic() + max(self.timeout, 300.0)  # start-up: imports TVM

    def _kill(self, slot: _Slot) -> None:
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(5)
        slot.conn.close()

    def close(self) -> None:
        """Stop every worker."""
        for slot in self.slots:
            try:
                slot.conn.send(None)
            except (OSError, ValueError):
                pass
        for slot in self.slots:
            slot.process.join(10)
            self._kill(slot)

    def run(self, tasks: Iterable[tuple[Case, list[str]]]) -> Iterable[tuple[str, str, Result]]:
        """Run ``(case, configs)`` tasks; yield ``(case name, config, result)`` as they finish."""
        queue = deque(tasks)
        while queue or any(s.case is not None for s in self.slots):
            for slot in self.slots:
                if slot.ready and slot.case is None and queue:
                    case, configs = queue.popleft()
                    slot.case, slot.remaining = case, list(configs)
                    slot.deadline = time.monotonic() + self.timeout
                    slot.conn.send((case, list(configs)))
            now = time.monotonic()
            wait_for = max(0.0, min(s.deadline for s in self.slots) - now)
            handles = {s.conn: s for s in self.slots}
            handles.update({s.process.sentinel: s for s in self.slots})
            ready = wait(list(handles), timeout=wait_for)
            for slot in self.slots:
                died = slot.conn in ready or slot.process.sentinel in ready
                if slot.conn in ready:
                    try:
                        while slot.conn.poll():
                            died = False
                            yield from self._receive(slot, slot.conn.recv())
                    except (EOFError, OSError):
                        died = True
                if died and not slot.process.is_alive():
                    yield from self._lost(slot, "crash", queue)
                elif time.monotonic() > slot.deadline:
                    yield from self._lost(slot, "timeout", queue)

    def _receive(self, slot: _Slot, msg: tuple) -> Iterable[tuple[str, str, Result]]:
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
            self.info = msg[1]
            slot.deadline = float("inf")
        elif kind == "failed":
            raise RuntimeError(f"onnx-suite: a worker could not start: {msg[1]}")
        elif kind == "result":
            _, name, config, result = msg
            if config in slot.remaining:
                slot.remaining.remove(config)
            slot.deadline = time.monotonic() + self.timeout
            yield name, config, result
        elif kind == "done":
            slot.case, slot.remaining = None, []
            slot.deadline = float("inf")

    def _lost(self, slot: _Slot, outcome: str, queue: deque) -> Iterable[tuple[str, str, Result]]:
        case, remaining = slot.case, slot.remaining
        code = slot.process.exitcode
        seconds = min(self.timeout, time.monotonic() - (slot.deadline - self.timeout))
        self._kill(slot)
        if case is None and not slot.ready:
            raise RuntimeError(f"onnx-suite: a worker died while starting (exit code {code})")
        self._start(slot)
        if case is None or not remaining:
            return
        if outcome == "crash":
            detail = f"worker died (exit code {code})"
        else:
            detail = f"no result within {self.timeout:g} s"
        yield case.name, remaining[0], Result(outcome, detail, seconds=seconds)
        if remaining[1:]:
            queue.appendleft((case, remaining[1:]))


# --------------------------------------------------------------------------- the suite


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("umahub", "apache-tvm", "apache-tvm-ffi", "onnx", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        import umahub

        out["umahub"] = getattr(umahub, "__version__", out["umahub"])
    except ImportError:
        pass
    return out


def _machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "tvm_num_threads": os.environ.get("TVM_NUM_THREADS", "default"),
    }


def _summary(cases: dict[str, dict[str, Result]], configs: Sequence[str]) -> dict[str, Any]:
    counts = {c: Counter(r[c].outcome for r in cases.values() if c in r) for c in CONFIGS}
    regressions = {
        c: sorted(n for n, r in cases.items() if is_regression(r.get("plain"), r.get(c)))
        for c in CONFIGS
        if c != "plain"
    }
    return {
        "cases": len(cases),
        "configs": list(configs),
        "outcomes": {c: dict(sorted(counts[c].items())) for c in CONFIGS if counts[c]},
        "regressions": regressions,
    }


def summary_line(summary: dict[str, Any]) -> str:
    """The one-line summary printed at the end of a run."""
    parts = [f"onnx-suite: {summary['cases']} cases"]
    for config in CONFIGS:
        outcomes = summary["outcomes"].get(config)
        if outcomes is not None:
            parts.append(f"{config} ok {outcomes.get('ok', 0)}")
    regs = summary["regressions"]
    have_plain = "plain" in summary["outcomes"]
    shown = [f"{len(regs[c])} ({c})" for c in CONFIGS[1:] if c in summary["outcomes"]]
    if shown and have_plain:
        parts.append("regressions " + " ".join(shown))
    return ", ".join(parts)


def _reuse_plain(path: Path, versions: dict[str, str]) -> dict[str, Result]:
    data = json.loads(path.read_text())
    old = data.get("versions", {})
    for dist in ("apache-tvm", "onnx"):
        if old.get(dist) != versions.get(dist):
            raise SystemExit(
                f"onnx-suite: {path} has plain results of {dist} {old.get(dist)}, "
                f"this is {versions.get(dist)}: run plain again (drop --reuse-plain)"
            )
    return {
        name: Result.from_json(entry["plain"])
        for name, entry in data.get("cases", {}).items()
        if "plain" in entry
    }


def run_suite(
    cases: Sequence[Case],
    configs: Sequence[str] = CONFIGS,
    *,
    jobs: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    plugins: Sequence[str] | None = DEFAULT_PLUGINS,
    pin_devices: Sequence[str] = PIN_DEVICES,
    plain_cache: dict[str, Result] | None = None,
    progress: Any = None,
) -> tuple[dict[str, dict[str, Result]], dict[str, Any]]:
    """Run ``cases`` in ``configs`` in worker processes.

    Plain results found in ``plain_cache`` are taken from it instead of run.
    ``progress(done, total, name, results)`` is called after each case.
    Returns the results per case and configuration, and what the workers
    reported (which umahub and TVM they imported).
    """
    plain_cache = plain_cache or {}
    results: dict[str, dict[str, Result]] = {c.name: {} for c in cases}
    tasks = []
    for case in cases:
        todo = list(configs)
        if "plain" in todo and case.name in plain_cache:
            results[case.name]["plain"] = plain_cache[case.name]
            todo.remove("plain")
        if todo:
            tasks.append((case, todo))
    expected = {c.name: len(configs) for c in cases}
    done = 0
    pool = _Pool(jobs, timeout, plugins, pin_devices)
    try:
        for name, config, result in pool.run(tasks):
            results[name][config] = result
            if len(results[name]) == expected[name]:
                done += 1
                if progress is not None:
                    progress(done, len(tasks), name, results[name])
    finally:
        pool.close()
    return results, pool.info


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m umahub.testing.onnx_suite",
        description="Run the ONNX backend node tests through plain TVM and through umahub.",
    )
    p.add_argument("-k", dest="select", metavar="SUBSTRING", help="only cases whose name has it")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of %(default)s")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per config")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results file (%(default)s)")
    p.add_argument(
        "--reuse-plain",
        nargs="?",
        const=True,
        default=None,
        metavar="FILE",
        help="take plain-TVM results from FILE (default: the --out file) instead of running them",
    )
    p.add_argument(
        "--list-regressions", action="store_true", help="print each regression with its detail"
    )
    p.add_argument(
        "--plugins",
        default=",".join(DEFAULT_PLUGINS),
        help="umahub plugins the hub loads, or 'all' for every installed one (%(default)s)",
    )
    p.add_argument(
        "--pin-devices", default=",".join(PIN_DEVICES), help="devices of random pins (%(default)s)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown config {unknown[0]!r}: choose from {', '.join(CONFIGS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (1: a regression, else 0)."""
    args = _parse(argv)
    plugins = None if args.plugins == "all" else [x for x in args.plugins.split(",") if x]
    pin_devices = [x for x in args.pin_devices.split(",") if x]
    versions = _versions()
    plain_cache: dict[str, Result] = {}
    if args.reuse_plain is not None and "plain" in args.configs:
        source = args.out if args.reuse_plain is True else Path(args.reuse_plain)
        if source.exists():
            plain_cache = _reuse_plain(source, versions)
            print(f"onnx-suite: {len(plain_cache)} plain results from {source}", file=sys.stderr)
        else:
            print(f"onnx-suite: no {source}; running plain", file=sys.stderr)

    t0 = time.monotonic()
    skipped: list[str] = []
    cases = load_cases(args.select, skipped=skipped)
    print(
        f"onnx-suite: {len(cases)} tensor-only cases ({len(skipped)} others left out), "
        f"generated in {time.monotonic() - t0:.0f} s; configs {','.join(args.configs)}",
        file=sys.stderr,
    )

    def progress(done: int, total: int, name: str, res: dict[str, Result]) -> None:
        if args.verbose or done % 50 == 0 or done == total:
            line = " ".join(f"{c}={res[c].outcome}" for c in CONFIGS if c in res)
            elapsed = time.monotonic() - t0
            print(f"[{done}/{total} {elapsed:.0f}s] {name}: {line}", file=sys.stderr, flush=True)

    results, info = run_suite(
        cases,
        args.configs,
        jobs=args.jobs,
        timeout=args.timeout,
        plugins=plugins,
        pin_devices=pin_devices,
        plain_cache=plain_cache,
        progress=progress,
    )
    summary = _summary(results, args.configs)
    op_of = {c.name: c.op_type for c in cases}
    report = {
        "suite": "onnx backend node tests",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 1),
        "machine": _machine(),
        "versions": versions,
        "worker": info,
        "options": {
            "select": args.select,
            "configs": args.configs,
            "jobs": args.jobs,
            "timeout": args.timeout,
            "plugins": plugins if plugins is not None else "all",
            "pin_devices": pin_devices,
            "reused_plain": len(plain_cache),
        },
        "left_out": {"reason": "an input or output is not a tensor", "cases": sorted(skipped)},
        "summary": summary,
        "cases": {
            name: {"op": op_of[name], **{c: r.to_json() for c, r in res.items()}}
            for name, res in sorted(results.items())
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    if args.list_regressions:
        for config, names in summary["regressions"].items():
            for name in names:
                r = results[name][config]
                print(f"regression ({config}) {name}: {r.outcome}: {r.detail}")
    print(f"onnx-suite: results in {args.out}", file=sys.stderr)
    print(summary_line(summary))
    return 1 if any(summary["regressions"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
