"""Stage 6, verify: the partitions checked on the user's own model (``verify = true``).

A plugin's kernel can have the right signature and the wrong arithmetic; the
conformance kit catches that only if the vendor runs it, and only on the kit's
models. Verification checks the model being compiled, right after it is built:

1. The compiled model runs once on random inputs of its signature (symbolic
   sizes 1), with the Relax VM's instrument watching every call of a
   partition: each partition's inputs are recorded as the model's own
   operators produced them (their value ranges, masks, indices), and so are its
   outputs.
2. Each partition's operators, as umahub's default lowering makes them (the
   TIR the lower stage made before scheduling, where the plugin used that
   lowering), are built for the host with LLVM, without any plugin hook, and
   run on the same inputs.
3. A partition passes when its largest absolute error is at most
   ``verify-tolerance`` times the largest magnitude of the host's outputs (at
   least 1); NaN or infinity where the host has none (or the reverse) fails.

Each partition is judged on its own recorded inputs, so a wrong partition does
not make the ones after it look wrong. A partition whose operators the default
lowering cannot take (a plugin lowers them itself), or that the run did not
reach (a branch not taken), is reported as not verified, with the reason.

Cost: one inference of the model, a default lowering of each partition's
operators and one LLVM build of all of them, then one run of each on the host,
unscheduled (``benchmarks/verify_cost.py`` measures it per zoo model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from umahub.compiler.compilation import Compilation, written
from umahub.compiler.lowering import default_relax_to_tir
from umahub.errors import VerificationError, last_line
from umahub.runtime.compiled import example_inputs

__all__ = ["Verdict", "run", "verify_partitions"]


@dataclass(frozen=True)
class Verdict:
    """What verification found for one partition.

    Attributes:
        symbol: the partition.
        max_error: the largest absolute error against the host, or None when
            it was not verified.
        limit: the largest error accepted for it.
        reason: why it was not verified, or "".
    """

    symbol: str
    max_error: float | None
    limit: float = 0.0
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True unless the partition was verified and found wrong."""
        return self.max_error is None or self.max_error <= self.limit

    def __str__(self) -> str:
        if self.max_error is None:
            return f"not verified: {self.reason}"
        verdict = "within" if self.ok else "beyond"
        return f"largest error {self.max_error:.3g}, {verdict} the limit {self.limit:.3g}"


def _record_calls(library: Any, devices: Sequence[Any], weights: Sequence[Any], arrays, symbols):
    """symbol -> numpy copies of the arguments (inputs, then outputs) of its first call."""
    import tvm
    from tvm import relax

    seen: dict[str, list[np.ndarray]] = {}

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if not before and symbol in symbols and symbol not in seen:
            seen[symbol] = [a.numpy() for a in args]
        return 0

    vm = relax.VirtualMachine(library, list(devices))
    vm.set_instrument(instrument)
    host = devices[0]
    args = [tvm.runtime.tensor(np.require(a, requirements="C"), host) for a in arrays]
    vm["main"](*args, *weights)
    return seen


def _largest_error(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        return float("inf")
    if got.dtype == bool or np.issubdtype(got.dtype, np.integer):
        return float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
    got, want = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite):
        return float("inf")
    same_special = np.array_equal(got[~finite], want[~finite], equal_nan=True)
    if not same_special:
        return float("inf")
    return float(np.max(np.abs(got[finite] - want[finite]), initial=0.0))


def _host_kernels(
    functions: Mapping[str, Any], lowered: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The host's kernels of the partitions, built for LLVM in one module.

    ``lowered`` holds the default lowering of partitions already lowered that
    way (before their schedules), reused rather than made again.

    Returns symbol -> packed function, and symbol -> why the host cannot lower
    it. One build for all (per-module setup dominates for small kernels); if
    that fails, each partition is built on its own, to say which one fails.
    """
    import tvm

    prims, failed = {}, {}
    for symbol, function in functions.items():
        try:
            tir = (
                lowered[symbol]
                if symbol in lowered
                else default_relax_to_tir(function, symbol, "host")
            )
            prims[symbol] = tir[symbol]
        except Exception as exc:
            failed[symbol] = _why(exc)
    try:
        built = tvm.tirx.build(tvm.IRModule(prims), target="llvm")
        return {s: built[s] for s in prims}, failed
    except Exception:
        kernels = {}
        for symbol, prim in prims.items():
            try:
                kernels[symbol] = tvm.tirx.build(tvm.IRModule({symbol: prim}), target="llvm")[
                    symbol
                ]
            except Exception as exc:
                failed[symbol] = _why(exc)
        return kernels, failed


def _why(exc: Exception) -> str:
    return f"the host cannot lower its operators ({type(exc).__name__}: {last_line(exc)})"


def _host_outputs(kernel: Any, args: list[np.ndarray], n_inputs: int) -> list[np.ndarray]:
    import tvm

    outputs = [np.zeros_like(a) for a in args[n_inputs:]]
    tensors = [tvm.runtime.tensor(a) for a in (*args[:n_inputs], *outputs)]
    kernel(*tensors)
    return [t.numpy() for t in tensors[n_inputs:]]


def verify_partitions(
    library: Any,
    devices: Sequence[Any],
    weights: Sequence[Any],
    inputs: Sequence[np.ndarray],
    functions: Mapping[str, Any],
    tolerance: float,
    lowered: Mapping[str, Any] | None = None,
    unpacked: Mapping[str, Mapping[int, np.ndarray]] | None = None,
    device_calls: Mapping[str, Any] | None = None,
    staged: Mapping[str, int] | None = None,
) -> dict[str, Verdict]:
    """Run each partition on the model's own values and compare with the host.

    Args:
        library: the compiled model (executable or loaded module).
        devices: the runtime devices, index = device index.
        weights: the weights already on their devices (extra ``main`` arguments).
        inputs: the model's inputs for the one recorded run.
        functions: partition symbol -> its Relax function (before lowering).
        tolerance: see the module's docs.
        lowered: symbol -> the default lowering's TIR, where it was made already.
        unpacked: symbol -> {input index: the weight as the model holds it},
            for the inputs a kernel takes packed (the host is given these).
        device_calls: symbol -> :class:`umahub.runtime.devices.DeviceCall` of the
            partitions on devices of their own, whose calls leave out the inputs
            resident on the device (the host is given them).
        staged: symbol -> how many inputs its calls pass after the function's own:
            the results of its kernel's constant stages
            (:mod:`umahub.host.constant_stages`; the host is not given them).

    Returns:
        symbol -> :class:`Verdict`, for every symbol of ``functions``.
    """
    recorded = _record_calls(library, devices, weights, inputs, set(functions))
    kernels, failed = _host_kernels(
        {s: f for s, f in functions.items() if s in recorded}, lowered or {}
    )
    verdicts = {}
    for symbol, function in functions.items():
        args = recorded.get(symbol)
        if args is None:
            verdicts[symbol] = Verdict(symbol, None, reason="not called by the run")
            continue
        if symbol in failed:
            verdicts[symbol] = Verdict(symbol, None, reason=failed[symbol])
            continue
        n_inputs = len(function.params)
        extra = (staged or {}).get(symbol, 0)
        args = args[:n_inputs] + args[n_inputs + extra :]
        call = (device_calls or {}).get(symbol)
        if call is not None:
            given = iter(args)
            args = [call.constants[at] if at >= 0 else next(given) for at in call.inputs]
            args += list(given)
        for index, weight in (unpacked or {}).get(symbol, {}).items():
            args[index] = weight
        wanted = _host_outputs(kernels[symbol], args, n_inputs)
        error = max((_largest_error(g, w) for g, w in zip(args[n_inputs:], wanted)), default=0.0)
        peaks = [float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0)) for w in wanted if w.size]
        if all(w.dtype == bool or np.issubdtype(w.dtype, np.integer) for w in wanted):
            scale = max([1.0, *peaks])  # integers: in units of the step, as before
        else:  # floats: relative to the reference's own scale, however small (no floor of 1)
            scale = max(peaks, default=0.0)
        verdicts[symbol] = Verdict(symbol, error, tolerance * scale)
    return verdicts


def run(comp: Compilation) -> set[str]:
    """Stage 6: verify the placed partitions; return those that failed (and fell back).

    The caller builds again when some did (see :func:`umahub.compiler.pipeline.compile`).
    """
    hub, reports, compiled = comp.hub, comp.reports, written(comp.compiled, "compiled")
    functions = {
        s: f for s, f in comp.functions().items() if s in comp.modules and not reports[s].fallback
    }
    runner = compiled._runner
    try:
        verdicts = verify_partitions(
            runner.library,
            runner.devices,
            runner.weights,
            example_inputs(compiled.input_info, seed=0),
            functions,
            hub.config.verify_tolerance,
            comp.reference_tir,
            comp.packers.originals,
            comp.device_calls,
            {s: len(stages.results) for s, stages in comp.packers.stages.items()},
        )
    except Exception as exc:  # no run to record: nothing is verified, nothing is blamed
        reason = f"the model did not run on random inputs ({type(exc).__name__}: {last_line(exc)})"
        verdicts = {s: Verdict(s, None, reason=reason) for s in functions}
    wrong = set()
    for symbol, verdict in verdicts.items():
        report = reports[symbol]
        report.verified = str(verdict)
        report.max_error = verdict.max_error
        if verdict.ok:
            continue
        acted = "; ".join(f"{hook}: {', '.join(p)}" for hook, p in report.hooks.items())
        owner = hub.owner(report.accelerator)
        message = (
            f"plugin '{owner}' computes wrong numbers in partition {symbol} "
            f"({', '.join(report.patterns)}) on {report.device}: {verdict} against the host's "
            f"lowering of the same operators on the model's own values (hooks that acted: "
            f"{acted or 'none, the default lowering and codegen'})"
        )
        comp.fall_back(symbol, message, VerificationError)
        wrong.add(symbol)
    return wrong
