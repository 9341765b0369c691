"""The cross-accelerator check: random graphs, random pins, every accelerator in one hub.

``pytest --umahub-conformance=npu,dsp --umahub-conformance-cross`` adds
:class:`CrossConformanceSuite`'s check for the named accelerators together;
umahub's own tests call :func:`check_placed_graph` on the bundled plugins.

One example is a graph of :func:`~umahub.testing._graphs.graphs` (``dag=True``)
over the operators of every named accelerator's patterns, pins of its operators
(:func:`~umahub.testing._graphs.placements`) to any accelerator, instance or
the host, and an order of the accelerators in ``priority``. It compiles through
a hub holding all their plugins and fails when:

* the compile raises (anything but a pin conflict inside one pattern match,
  a user error that :class:`~umahub.errors.PlacementError` names), or a
  partition falls back to the host (a plugin failed: what ``on-error =
  "error"`` would stop on); a pin that cannot be honoured is only a warning,
  and is suppressed;
* the placement breaks a pin: an operator pinned to ``accel:i`` (or ``accel``)
  whose pin was not reported as unhonoured runs elsewhere, by a pattern of
  another accelerator, or outside a partition; an operator pinned to ``host``
  runs anywhere else; an unpinned operator runs on a device whose patterns
  did not take it;
* the run raises, or the outputs differ from plain ``tvm.compile`` beyond
  :data:`~umahub.testing.TOLERANCE`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from umahub.testing._compare import compare
from umahub.testing._session import cross_config

__all__ = [
    "CrossConformanceSuite",
    "Placed",
    "check_placed_graph",
    "cross_config",
    "cross_vocabulary",
    "likely_pins",
]

#: The message of a pin that cannot be honoured: ``pin 'n3' -> 'npu': operator 'n3' ...``.
_UNHONOURED = re.compile(r"^umahub: pin '(?P<selector>[^']*)' -> '[^']*': operator ")
#: A pin conflict inside one match (a user error the compile names, not a crash).
_CONFLICT = "holds operators pinned to two instances"


def cross_vocabulary(
    hub: Any, accelerators: Sequence[str]
) -> tuple[tuple[str, ...], dict[str, set[str]]]:
    """(the operators random graphs are made of, accelerator -> the ops its patterns mention)."""
    from umahub.compiler.placement import normalise_pattern
    from umahub.testing._graphs import pattern_ops, vocabulary

    mentioned: dict[str, set[str]] = {}
    for name in accelerators:
        acc = hub.accelerator(name)
        patterns = [
            normalise_pattern(acc, p)[1]
            for result in hub.hook.umahub_patterns(accelerator=acc)
            for p in (result or [])
        ]
        mentioned[name] = pattern_ops(patterns)
    return vocabulary(set().union(*mentioned.values())), mentioned


def likely_pins(
    mentioned: Mapping[str, set[str]], instances: Mapping[str, int]
) -> dict[str, list[str]]:
    """op -> the pins (``accel``, ``accel:i``) of the accelerators whose patterns mention it."""
    likely: dict[str, list[str]] = {}
    for name, ops in mentioned.items():
        for op in ops:
            likely.setdefault(op, []).extend(
                [name, *(f"{name}:{i}" for i in range(instances.get(name, 1)))]
            )
    return likely


@dataclass
class Placed:
    """What one example did (for the report and the tests' own assertions).

    Attributes:
        operators: the graph's operators.
        devices: node name -> the device it ran on.
        pinned: the pins given.
        unhonoured: the selectors of pins reported as not honoured.
        conflict: the compile refused pins that put one match on two instances
            (the message); nothing else was checked.
        largest_error: the largest absolute difference from plain TVM.
    """

    operators: int = 0
    devices: dict[str, str] = field(default_factory=dict)
    pinned: dict[str, str] = field(default_factory=dict)
    unhonoured: set[str] = field(default_factory=set)
    conflict: str = ""
    largest_error: float = 0.0

    @property
    def taken(self) -> int:
        """Operators that ran on an accelerator."""
        return sum(1 for d in self.devices.values() if d != "host")


def _first_line(exc: BaseException) -> str:
    """The gist of an exception: its first line (past a TVM trace) and its last, shortened."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Traceback", "File ", "at "))] or lines
    if not lines:
        return ""
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= 400 else text[:397] + "..."


def _honoured(device: str, pin: str) -> bool:
    if pin == "host":
        return device == "host"
    if ":" in pin:
        return device == pin
    return device.split(":")[0] == pin


def check_placed_graph(
    hub: Any,
    spec: Any,
    pins: Mapping[str, str],
    *,
    allow_conflicts: bool = True,
    reference: Any = None,
) -> Placed:
    """Compile ``spec`` with ``pins`` through ``hub``, check placement and outputs.

    Args:
        hub: a hub made with :func:`cross_config`.
        spec: a :class:`~umahub.testing._graphs.GraphSpec`.
        pins: node name -> ``accel``, ``accel:i`` or ``host``.
        allow_conflicts: a :class:`~umahub.errors.PlacementError` for two
            instances pinned inside one match is an outcome, not a failure
            (False where no pattern can match two pinned operators).
        reference: plain TVM's outputs, if already known.

    Returns:
        What happened (:class:`Placed`).

    Raises:
        AssertionError: a crash, a broken pin or a mismatch; the message
            names the graph, the pins and the priority.
    """
    from umahub.errors import PlacementError
    from umahub.hub.hub import UmahubWarning
    from umahub.testing._graphs import build, graph_inputs
    from umahub.testing._session import host_outputs

    where = f"{spec!r} pins={dict(pins)!r} priority={list(hub.config.priority)!r}"
    mod, xs = build(spec), graph_inputs(spec)
    placed = Placed(operators=spec.operators, pinned=dict(pins))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UmahubWarning)
        try:
            compiled = hub.compile(mod, placement=dict(pins))
        except PlacementError as exc:
            if allow_conflicts and _CONFLICT in str(exc):
                placed.conflict = str(exc)
                return placed
            raise AssertionError(
                f"{where} did not compile: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        except Exception as exc:
            raise AssertionError(
                f"{where} did not compile: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
    problems = []
    for w in caught:
        if not issubclass(w.category, UmahubWarning):
            continue
        text = str(w.message)
        hit = _UNHONOURED.match(text)
        if hit is None:
            problems.append(f"warning: {text}")
        else:
            placed.unhonoured.add(hit["selector"])
    report = compiled.report
    problems += [
        f"partition {p.symbol} fell back: {p.fallback}" for p in report.partitions if p.fallback
    ]
    by_name = {o.name: o for o in report.placement}
    placed.devices = {o.name: o.device for o in report.placement}
    expected = {name for name, _ in spec.nodes}
    if set(by_name) != expected:
        problems.append(f"the report places {sorted(by_name)}, the graph has {sorted(expected)}")
    for node, pin in pins.items():
        o = by_name.get(node)
        if o is None:
            continue
        if _honoured(o.device, pin):
            if node in placed.unhonoured:
                problems.append(
                    f"pin {node!r} -> {pin!r} is reported unhonoured, yet {node} runs on {o.device}"
                )
            if o.pinned != node:
                problems.append(
                    f"{node} runs on {o.device} as pinned, but the report says "
                    f"pinned by {o.pinned!r}"
                )
        elif pin == "host":
            problems.append(f"{node} ({o.op}) is pinned to host, yet runs on {o.device}")
        elif node not in placed.unhonoured:
            problems.append(
                f"{node} ({o.op}) is pinned to {pin}, yet runs on {o.device} "
                f"(pattern {o.pattern!r}) and no warning says the pin cannot be honoured"
            )
    for o in report.placement:
        if o.device == "host":
            if o.partition:
                problems.append(f"{o.name} runs on host, but in partition {o.partition}")
            continue
        accel = o.device.split(":")[0]
        if not o.pattern.startswith(f"{accel}.") or not o.partition:
            problems.append(
                f"{o.name} ({o.op}) runs on {o.device} by pattern {o.pattern!r}, "
                f"partition {o.partition!r}"
            )
    for p in report.partitions:
        if not p.fallback and p.device.split(":")[0] != p.accelerator:
            problems.append(f"partition {p.symbol} of {p.accelerator} is on {p.device}")
    if problems:
        raise AssertionError(f"{where}: {'; '.join(problems)}")
    try:
        outputs = compiled.run(*xs)
    except Exception as exc:
        raise AssertionError(
            f"{where} compiled but did not run: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    if reference is None:
        reference = host_outputs(mod, xs)
    placed.largest_error, problem = compare(outputs, reference, where)
    if problem:
        raise AssertionError(problem)
    return placed


class CrossConformanceSuite:
    """The cross-accelerator check: random graphs with random pins, all accelerators in one hub.

    Added by ``--umahub-conformance=a,b --umahub-conformance-cross``, or
    subclassed in a vendor's tests, naming the accelerators (or plugins)
    together with the marker::

        @pytest.mark.umahub_conformance(accelerator=["npu", "dsp"], examples=20)
        class TestNpuWithDsp(CrossConformanceSuite):
            pass
    """

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """One test for the named accelerators together (id ``a+b``)."""
        from umahub.testing._options import suite_options
        from umahub.testing._session import UsageProblem

        try:
            targets, _, _ = suite_options(metafunc.definition, metafunc.config)
        except UsageProblem as exc:
            pytest.fail(str(exc), pytrace=False)
        names = "+".join(t.accelerator for t in targets)
        metafunc.parametrize("accelerators", [names], ids=[names])

    def test_random_placement(self, request: pytest.FixtureRequest, accelerators: str) -> None:
        """Random graphs over all their operators, random pins: compile, placement, outputs.

        Deterministic (``derandomize=True``), no example database, no shrinking.
        At least one operator must run on an accelerator over all the examples.
        """
        pytest.importorskip(
            "hypothesis", reason="random graphs need hypothesis (pip install 'umahub[test]')"
        )
        from hypothesis import given
        from hypothesis import strategies as st

        from umahub.testing._graphs import graphs, kit_settings, pin_choices, placements
        from umahub.testing._options import session_of, suite_options

        session = session_of(request.config)
        targets, _, examples = suite_options(request.node, request.config)
        names = [t.accelerator for t in targets]
        plugins = [t.plugin for t in targets]
        ops, mentioned = cross_vocabulary(session.cross_hub(plugins, names), names)
        likely = likely_pins(mentioned, {t.accelerator: t.instances for t in targets})
        record = session.recorder
        record.cross(accelerators, accelerators=names, vocabulary=list(ops))
        if not ops:
            said = ", ".join(sorted(set().union(*mentioned.values()))) or "none"
            pytest.skip(
                f"the patterns of {', '.join(names)} mention no operator the graph "
                f"generator knows (they mention: {said})"
            )
        choices = pin_choices((t.accelerator, t.instances) for t in targets)
        seen: list[Placed] = []

        @kit_settings(examples)
        @given(st.data())
        def check(data: Any) -> None:
            spec = data.draw(graphs(ops, dag=True, max_steps=7), label="graph")
            pins = data.draw(placements(spec, choices, likely), label="pins")
            priority = data.draw(st.permutations(names), label="priority")
            hub = session.cross_hub(plugins, priority)
            placed = check_placed_graph(hub, spec, pins)
            seen.append(placed)
            record.cross_error(accelerators, placed.largest_error)

        try:
            check()
        finally:
            record.cross(
                accelerators,
                examples=len(seen),
                operators_total=sum(p.operators for p in seen),
                operators_taken=sum(p.taken for p in seen),
                pins=sum(len(p.pinned) for p in seen),
                pins_unhonoured=sum(len(p.unhonoured) for p in seen),
                pin_conflicts=sum(1 for p in seen if p.conflict),
            )
        if not any(p.taken for p in seen):
            raise AssertionError(
                f"no operator of {len(seen)} random graph(s) ran on {', '.join(names)}"
            )
