"""Stage 1, placement planning: who may claim what.

The plan is the list of patterns that partitioning will match, in claiming
order: the ``priority`` accelerators first (first claimant wins, the host takes
the rest), then accelerators that claim only what is pinned to them. Pins are
carried in the patterns' checks: a match that holds an operator pinned
elsewhere is rejected, so the operator goes on to its pinned accelerator (or
stays on the host).

A pin selector matches an operator by its node name (``"lv3"``), its op name
(``"relax.nn.conv2d"``, or without the ``relax.`` prefix: ``"nn.conv2d"``), or
the name of the pattern that claims it (``"npu.matmul"``); globs
(``"conv*"``) are allowed. Exact selectors win over globs; among equals, the
first written wins. Pins come from ``[tool.umahub.placement]``, from the
model (the ``main`` function's attribute ``"umahub.placement"``, see
:func:`annotate`) and from ``hub.compile(mod, placement=...)``, the latter
overriding the former.

Why this module is long: the pins, the guard that enforces them on every
match, and what the guard records (accepted matches, refusals, checks that
raised) are one mechanism; apart, each would reach into the others.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from umahub._tvm import name_of
from umahub.config import HOST, Pin, parse_pin
from umahub.errors import PatternCheckFailure
from umahub.ir import bindings, span_name, var_uses
from umahub.plugin.accelerator import Accelerator
from umahub.plugin.patterns import refusal_reason

__all__ = [
    "MODEL_PLACEMENT_ATTR",
    "CheckFailures",
    "Matches",
    "Pins",
    "PlannedPattern",
    "Refusals",
    "annotate",
    "model_pins",
    "normalise_pattern",
    "pinned_accelerators",
]

#: The ``main`` attribute that carries pins written into the model.
MODEL_PLACEMENT_ATTR = "umahub.placement"  # stored in models: its name stays


def annotate(mod: tvm.IRModule, placement: Mapping[str, str]) -> tvm.IRModule:
    """Return ``mod`` with pins written into its ``main`` (selector -> ``"accel[:i]"``/``"host"``).

    The pins travel with the model: every hub that compiles it honours them,
    unless its config or the ``compile`` call pins the same selector elsewhere.
    """
    for value in placement.values():
        parse_pin(value, "umahub.annotate")
    main = mod["main"]
    old = (
        dict(main.attrs[MODEL_PLACEMENT_ATTR])
        if main.attrs and (MODEL_PLACEMENT_ATTR in main.attrs)
        else {}
    )
    merged = {**{str(k): str(v) for k, v in old.items()}, **dict(placement)}
    new = mod.copy() if hasattr(mod, "copy") else tvm.IRModule(mod.functions, attrs=mod.attrs)
    new[mod.get_global_var("main")] = main.with_attr(MODEL_PLACEMENT_ATTR, merged)
    return new


def model_pins(mod: tvm.IRModule) -> dict[str, Pin]:
    """The pins written into ``mod`` by :func:`annotate`."""
    main = mod["main"]
    if not main.attrs or MODEL_PLACEMENT_ATTR not in main.attrs:
        return {}
    return {
        str(k): parse_pin(str(v), f"model attribute {MODEL_PLACEMENT_ATTR}")
        for k, v in main.attrs[MODEL_PLACEMENT_ATTR].items()
    }


def _op_names(op: str) -> tuple[str, ...]:
    short = op.removeprefix("relax.")
    return (op, short) if short != op else (op,)


class Pins:
    """Pin selectors in precedence order, resolved per operator."""

    def __init__(self, layers: Sequence[Mapping[str, Pin]]):
        merged: dict[str, Pin] = {}
        for layer in layers:  # later layers override earlier ones, selector by selector
            merged.update(layer)
        exact = [(s, p) for s, p in merged.items() if not _is_glob(s)]
        globs = [(s, p) for s, p in merged.items() if _is_glob(s)]
        self.ordered: list[tuple[str, Pin]] = exact + globs
        #: Placement by cost's choice, node -> accelerator name (absent: the host);
        #: None when placement is by priority. Pins are already part of it.
        self.chosen: Mapping[str, str] | None = None

    def __bool__(self) -> bool:
        return bool(self.ordered)

    def resolve(self, node: str, op: str, pattern: str = "") -> tuple[str, Pin] | None:
        """The (selector, pin) that places this operator, or None."""
        names = (node, *_op_names(op), *((pattern,) if pattern else ()))
        for selector, pin in self.ordered:
            if any(fnmatch.fnmatchcase(n, selector) for n in names):
                return selector, pin
        return None

    def for_pattern(self, pattern: str) -> Pin | None:
        """A pin whose selector names (or globs) the pattern itself."""
        for selector, pin in self.ordered:
            if fnmatch.fnmatchcase(pattern, selector):
                return pin
        return None


def _is_glob(selector: str) -> bool:
    return any(ch in selector for ch in "*?[")


@dataclass(frozen=True)
class PlannedPattern:
    """One pattern of the plan, with its accelerator and whether it claims freely."""

    accelerator: Accelerator
    name: str
    pattern: Any
    annotations: Mapping[str, Any]
    check: Callable[[Any], Any] | None  # true: take; false or a Refusal: refuse
    claims: bool  # False: the accelerator takes only what is pinned to it

    def fusion_pattern(
        self,
        pins: Pins,
        accepted: list | None = None,
        failures: CheckFailures | None = None,
        refusals: Refusals | None = None,
    ) -> relax.transform.FusionPattern:
        """The FusionPattern with a check that also enforces the pins.

        Every accepted match is appended to ``accepted`` as
        ``(pattern name, [(node, op), ...])``. A plugin check that raises
        refuses the match (its operators go on to the next claimant or the
        host) and is recorded in ``failures``.
        A refused match that holds an operator pinned to this accelerator is
        recorded in ``refusals``, with why (see :class:`Refusals`).
        """
        guard = _guard(self, pins, accepted, failures, refusals)
        return relax.transform.FusionPattern(self.name, self.pattern, dict(self.annotations), guard)


def matched_operators(ctx: Any, producers: dict | None = None) -> list[tuple[str, str]]:
    """(node name, op name) of every operator in a pattern match; in the function's
    binding order when ``producers`` (:func:`producers_of`) gives it (TVM's map of the
    matched bindings has an order of its own, and names may repeat: a convolution's
    weight and bias dequantized under the convolution's name)."""
    items = list(ctx.matched_bindings.items())
    if producers:
        items.sort(key=lambda item: producers.get(item[0], (-1,))[0])
    nodes = []
    for var, value in items:
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            nodes.append((span_name(value) or name_of(var), value.op.name))
    return nodes


class Matches(list):
    """The matches accepted so far, as ``(pattern name, [(node, op), ...])``.

    It also holds the bindings they take: a binding already in an accepted
    match is refused to any later one. TVM's FuseOpsByPattern (0.25-0.27) may
    otherwise accept two overlapping matches (a convolution read by two adds,
    each a "conv2d + bias" match) and leave one of them as a composite without
    its convolution, which its pattern never described.
    """

    def __init__(
        self,
        inner_outputs: bool = True,
        producers: dict | None = None,
        quantized: dict | None = None,
        inexact: dict | None = None,
    ) -> None:
        super().__init__()
        #: bound variable -> the quantized operator it is part of (its final
        #: quantize's variable), from :func:`quantized_parts`.
        self.quantized = quantized or {}
        #: the final quantize's variable of each quantized operator that umahub does
        #: not compute in integers -> why (:func:`inexact_quantized`).
        self.inexact = inexact or {}
        #: binding -> the pattern of the accepted match that holds it.
        self.taken: dict = {}
        #: Whether a match may hold, other than as its result, a value that its
        #: dataflow block outputs; TVM 0.25's FuseOpsByPattern loses such a value.
        self.inner_outputs = inner_outputs
        #: bound variable -> (its position in the function, the variables it
        #: reads): :func:`producers_of`, to refuse a match that would be a cycle.
        self.producers = producers or {}


def quantized_parts(func: Any) -> dict:
    """Each variable ``func`` binds inside a quantized operator (its float
    convolution or matmul, bias add, residual add and activation) -> the
    variable of the operator's final quantize.

    A quantized operator here is the form (:func:`umahub.plugin.quantized`):
    a convolution or matmul of two dequantized operands, then adds and an
    activation, then a quantize; whether or not umahub computes it in integers
    (:func:`umahub.plugin.describe_quantized`). One it does not (a scale per
    input channel, 16-bit operands) runs on the host as written, whole: a
    float pattern taking its convolution would compute it elsewhere in float32
    and round differently. A quantized mean (``quantize(mean(dequantize(x)))``,
    :mod:`umahub.plugin.integer_mean`) is one too: its mean is its part, and
    its dequantize where nothing else reads it.
    """
    bound = {b.var: b.value for b in bindings(func)}
    parts: dict = {}
    uses = None
    for var, value in bound.items():
        if not (
            isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.quantize"
        ):
            continue
        mean = _quantized_mean(value, bound)
        if mean is not None:
            parts[mean] = var
            # its dequantize too, where it is its own: a match of mean and quantize alone
            # would read float32 values and sum them in its own order
            dequantized = bound[mean].args[0]
            if uses is None:
                uses = var_uses(func)
            if uses.get(dequantized, 0) == 1 and uses.get(mean, 0) == 1:
                parts[dequantized] = var
            continue
        chain, inner = [], value.args[0]
        while isinstance(inner, relax.Var) and inner in bound and inner not in parts:
            step = bound[inner]
            if not _float_op(step):
                break
            chain.append(inner)
            if step.op.name in _PRODUCERS:
                break
            # an activation or an add: on to the convolution or matmul
            inner = next(
                (
                    a
                    for a in step.args
                    if isinstance(a, relax.Var) and a in bound and _float_op(bound[a])
                ),
                None,
            )
        producer = bound[chain[-1]] if chain else None
        if (
            producer is not None
            and producer.op.name in _PRODUCERS
            and _dequantized(producer, bound)
        ):
            parts.update(dict.fromkeys(chain, var))
    return parts


_PRODUCERS = ("relax.nn.conv2d", "relax.matmul")


def inexact_quantized(func: Any, parts: dict) -> dict:
    """Each quantized operator (or quantized mean) of ``parts`` (:func:`quantized_parts`)
    that umahub does not compute in integers: its final quantize's variable -> why
    (the reason of :func:`umahub.plugin.describe_quantized` or
    :func:`umahub.plugin.describe_quantized_mean`). Such an operator runs on the host
    as written, whole: no match may hold it (see :class:`Matches`)."""
    from umahub.plugin.integer_mean import describe_quantized_mean
    from umahub.plugin.quantization import describe_quantized

    bound = {b.var: b.value for b in bindings(func)}
    means = {r for v, r in parts.items() if bound[v].op.name == "relax.mean"}
    found = {}
    for root in set(parts.values()):
        describe = describe_quantized_mean if root in means else describe_quantized
        try:
            describe(bound[root], bound.get)
        except ValueError as exc:
            found[root] = str(exc)
    return found


def _quantized_mean(quantize: relax.Call, bound: dict) -> Any:
    """The mean's variable where ``quantize`` quantizes the mean of a dequantized
    tensor (:mod:`umahub.plugin.integer_mean`), else None."""
    inner = quantize.args[0]
    mean = bound.get(inner) if isinstance(inner, relax.Var) else None
    if not (isinstance(mean, relax.Call) and getattr(mean.op, "name", "") == "relax.mean"):
        return None
    return inner if _dequantized(mean, bound) else None


def _dequantized(producer: relax.Call, bound: dict) -> bool:
    """Whether both operands of ``producer`` are dequantized."""
    for arg in producer.args:
        value = bound.get(arg) if isinstance(arg, relax.Var) else arg
        if not (
            isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.dequantize"
        ):
            return False
    return True


def _float_op(value: Any) -> bool:
    return isinstance(value, relax.Call) and getattr(value.op, "name", "") in (
        "relax.nn.conv2d",
        "relax.matmul",
        "relax.add",
        "relax.nn.relu",
        "relax.clip",
    )


def producers_of(func: Any) -> dict:
    """Each variable ``func`` binds -> (its position, the variables its value reads)."""
    found: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            reads: list = []
            _variables(binding.value, reads)
            found[binding.var] = (len(found), tuple(reads))
    return found


def _variables(expr: Any, out: list) -> None:
    if isinstance(expr, relax.Var):
        out.append(expr)
    elif isinstance(expr, relax.Call):
        for arg in expr.args:
            _variables(arg, out)
    elif isinstance(expr, relax.Tuple):
        for field in expr.fields:
            _variables(field, out)
    elif isinstance(expr, relax.TupleGetItem):
        _variables(expr.tuple_value, out)


def _through_outside(producers: dict, ctx: Any) -> bool:
    """Whether a value outside the match is computed from the match and read by it.

    Fused, such a match would depend on itself; TVM's FuseOpsByPattern (0.25-0.27)
    then stops with "a cyclic dependency detected" instead of refusing it (a
    convolution, its tanh pinned elsewhere, and an add of the two). The search
    goes back from what the match reads no further than its first binding.
    """
    inside = set(ctx.matched_bindings.keys())
    known = [producers[v] for v in inside if v in producers]
    if not producers or not known:
        return False
    first = min(position for position, _ in known)
    todo = [a for _, reads in known for a in reads if a not in inside]
    seen: set = set()
    while todo:
        var = todo.pop()
        if var in seen or var not in producers:
            continue
        seen.add(var)
        position, reads = producers[var]
        if position < first:
            continue
        for read in reads:
            if read in inside:
                return True
            todo.append(read)
    return False


def _holds_inner_output(ctx: Any) -> bool:
    """Whether a match holds a block output other than its own result."""
    from tvm import relax

    root = ctx.value_to_bound_var.get(ctx.matched_expr)
    return any(
        not isinstance(var, relax.DataflowVar) and not (root is not None and var.same_as(root))
        for var in ctx.matched_bindings.keys()
    )


def _guard(
    planned: PlannedPattern,
    pins: Pins,
    accepted: list | None,
    failures: CheckFailures | None,
    refusals: Refusals | None = None,
) -> Callable[[Any], bool]:
    def guarded(ctx: Any) -> bool:
        why = _taken(accepted, ctx)
        if why is None and refusals is not None and refusals.unfit:
            nodes = [n for n, _ in matched_operators(ctx)]
            why = refusals.unfit_reason(planned.accelerator.name, nodes)
            if why is not None:
                refusals.add_check(planned.accelerator.name, nodes, why)
        if why is None:
            try:
                why = _pinned_out(planned, pins, ctx)
                if why is None:
                    if planned.check is not None:
                        why = refusal_reason(planned.check(ctx))
                    if why is None:  # after the check: umahub's quantized() patterns say why
                        why = _holds_inexact(accepted, ctx)
                    if why is not None and refusals is not None:
                        nodes = [n for n, _ in matched_operators(ctx)]
                        refusals.add_check(planned.accelerator.name, nodes, why)
            except Exception as exc:  # a plugin's check: never let it through TVM's pass
                if failures is not None:
                    failures.add(planned, [n for n, _ in matched_operators(ctx)], exc)
                return False
        if why is not None:
            if refusals is not None and (
                (pins and _wanted(planned, pins, ctx)) or _ends_quantized(accepted, ctx)
            ):
                refusals.add(planned.name, [n for n, _ in matched_operators(ctx)], why)
            return False
        if accepted is not None:
            accepted.append(
                (planned.name, matched_operators(ctx, getattr(accepted, "producers", None)))
            )
            taken = getattr(accepted, "taken", None)
            if taken is not None:
                taken.update(dict.fromkeys(ctx.matched_bindings.keys(), planned.name))
        return True

    return guarded


def _taken(accepted: list | None, ctx: Any) -> str | None:
    """Why a match may not be taken whatever its check says (None: it may)."""
    taken = getattr(accepted, "taken", None)
    if taken:
        owner = next((taken[v] for v in ctx.matched_bindings.keys() if v in taken), None)
        if owner is not None:  # first claimant wins
            return f"part of the match is already taken by a match of pattern '{owner}'"
    split = _splits_quantized(getattr(accepted, "quantized", {}), ctx)
    if split is not None:
        return (
            f"it holds part of the quantized operator ending at '{split}' and not the rest: "
            "a quantized operator is claimed whole (umahub.plugin.quantization)"
        )
    if _through_outside(getattr(accepted, "producers", {}), ctx):
        return (
            "a value outside the match is computed from it and read by it: "
            "fused, the match would depend on itself"
        )
    if not getattr(accepted, "inner_outputs", True) and _holds_inner_output(ctx):
        return (
            "the match holds a value the model also uses outside it, "
            "which this TVM's FuseOpsByPattern cannot keep"
        )
    return None


def _holds_inexact(accepted: Any, ctx: Any) -> str | None:
    """Why a match may not hold a quantized operator umahub does not compute in
    integers (None: it holds none). Computed elsewhere in float32, in its own
    order, it would round differently than on the host, where it runs as written."""
    inexact = getattr(accepted, "inexact", {})
    for var in ctx.matched_bindings.keys():
        if var in inexact:
            return (
                f"it holds the quantized operator ending at '{name_of(var)}', which umahub "
                f"does not compute in integers ({inexact[var]}): it runs on the host as written"
            )
    return None


def _ends_quantized(accepted: Any, ctx: Any) -> bool:
    """Whether the match holds a quantized operator's end: why it was refused is reported
    whether or not the operator is pinned (it runs on the host, in integers)."""
    roots = set(getattr(accepted, "quantized", {}).values())
    return bool(roots) and any(v in roots for v in ctx.matched_bindings.keys())


def _splits_quantized(parts: dict, ctx: Any) -> str | None:
    """The name of a quantized operator the match holds part of (or its end) but not
    the whole, or None."""
    if not parts:
        return None
    held = set(ctx.matched_bindings.keys())
    roots = set(parts.values())
    touched = {parts[v] for v in held if v in parts} | {v for v in held if v in roots}
    for root in touched:
        if root not in held or any(r.same_as(root) and v not in held for v, r in parts.items()):
            return name_of(root)
    return None


def _wanted(planned: PlannedPattern, pins: Pins, ctx: Any) -> bool:
    """Whether the match holds an operator (or is of a pattern) pinned to its accelerator."""
    accel = planned.accelerator.name
    pattern_pin = pins.for_pattern(planned.name)
    if pattern_pin is not None and pattern_pin.accelerator == accel:
        return True
    for node, op in matched_operators(ctx):
        hit = pins.resolve(node, op, planned.name)
        if hit is not None and hit[1].accelerator == accel:
            return True
    return False


def _pinned_out(planned: PlannedPattern, pins: Pins, ctx: Any) -> str | None:
    """Why the pins refuse the match (one holding an operator pinned elsewhere, or
    placed elsewhere by cost), or None: then the pattern's check decides."""
    accel = planned.accelerator.name
    wanted = False
    if pins.chosen is not None:
        for node, _ in matched_operators(ctx):
            where = pins.chosen.get(node, HOST)
            if where != accel:
                return f"placement by cost put '{node}' on {where}"
    if pins:
        pattern_pin = pins.for_pattern(planned.name)
        if pattern_pin is not None:
            if pattern_pin.accelerator != accel:
                return f"pattern '{planned.name}' is pinned to '{pattern_pin}'"
            wanted = True
        for node, op in matched_operators(ctx):
            hit = pins.resolve(node, op, planned.name)
            if hit is not None:
                selector, pin = hit
                if pin.accelerator != accel:
                    return f"the match also holds '{node}', pinned to '{pin}' by {selector!r}"
                wanted = True
    if not planned.claims and not wanted:
        return "its accelerator takes only what is pinned to it"
    return None


class Refusals(dict):
    """Why matches holding a pinned operator were refused: node -> [(pattern, reason)].

    Only matches that hold an operator pinned to the pattern's accelerator
    are recorded (those are the ones a user asked for), each (pattern,
    reason) once per node. The reason is "" when a plugin's check refused
    without giving one.

    Besides, :attr:`checks` keeps what the accelerators' pattern checks refused,
    pinned or not: node -> {accelerator: reason}, the first refused match's
    reason per accelerator (what the report shows as ``Operator.refused``).

    ``unfit`` (node -> {accelerator: why}) are the operators an earlier try of
    the compile found do not fit an accelerator: its patterns refuse every
    match holding one of them, for that reason.
    """

    def __init__(self, unfit: Mapping[str, Mapping[str, str]] | None = None) -> None:
        super().__init__()
        #: node -> {accelerator: the reason its first refused match's check gave}.
        self.checks: dict[str, dict[str, str]] = {}
        #: node -> {accelerator: why it does not fit there}; kept by :meth:`clear`.
        self.unfit = unfit or {}

    def unfit_reason(self, accelerator: str, nodes: Sequence[str]) -> str | None:
        """Why a match of ``accelerator`` over ``nodes`` does not fit it, or None."""
        return next(
            (self.unfit[n][accelerator] for n in nodes if accelerator in self.unfit.get(n, {})),
            None,
        )

    def add_check(self, accelerator: str, nodes: Sequence[str], reason: str) -> None:
        """Record that ``accelerator``'s check refused a match over ``nodes`` for ``reason``
        (kept only where that accelerator has no reason for the node yet)."""
        for node in nodes:
            self.checks.setdefault(node, {}).setdefault(accelerator, reason)

    def clear(self) -> None:
        """Forget every refusal (the checks run again)."""
        super().clear()
        self.checks.clear()

    def add(self, pattern: str, nodes: Sequence[str], reason: str) -> None:
        """Record that a match of ``pattern`` over ``nodes`` was refused for ``reason``."""
        for node in nodes:
            seen = self.setdefault(node, [])
            if (pattern, reason) not in seen:
                seen.append((pattern, reason))

    def of(self, node: str, accelerator: str) -> list[tuple[str, str]]:
        """The refusals of ``accelerator``'s patterns of matches holding ``node``."""
        return [(p, r) for p, r in self.get(node, ()) if p.split(".", 1)[0] == accelerator]


class CheckFailures:
    """The pattern checks that raised while partitioning, as :class:`PatternCheckFailure`.

    A check that raises refuses its match rather than stopping the compile
    (an exception must not go through TVM's pass): it is recorded here, and
    the partition stage reports it, once per pattern, when partitioning is done.
    """

    def __init__(self, owner: Callable[[str], str]) -> None:
        #: accelerator name -> the plugin blamed for its patterns' checks.
        self.owner = owner
        self.failures: list[PatternCheckFailure] = []

    def add(self, planned: PlannedPattern, nodes: Sequence[str], cause: Exception) -> None:
        """Record that ``planned``'s check raised ``cause`` on a match over ``nodes``."""
        plugin = self.owner(planned.accelerator.name)
        self.failures.append(PatternCheckFailure(plugin, planned.name, nodes, cause))

    def clear(self) -> None:
        """Forget every failure (the checks run again)."""
        self.failures.clear()

    def by_pattern(self) -> dict[str, list[PatternCheckFailure]]:
        """The failures by pattern name, patterns in the order they first failed."""
        found: dict[str, list[PatternCheckFailure]] = {}
        for failure in self.failures:
            found.setdefault(failure.pattern, []).append(failure)
        return found


def normalise_pattern(accelerator: Accelerator, item: Any) -> tuple[str, Any, dict, Any]:
    """(name, pattern, annotations, check) of one pattern in either accepted form.

    Raises:
        PluginOutputError: a malformed pattern (see :func:`umahub.hub.contract.checked_patterns`).
    """
    from umahub.hub.contract import checked_patterns

    return checked_patterns(accelerator, [item])[0]


def pinned_accelerators(pins: Pins) -> set[str]:
    """Names of the accelerators some pin sends operators to."""
    return {pin.accelerator for _, pin in pins.ordered if pin.accelerator != HOST}
