"""The conformance checks, as the methods of :class:`ConformanceSuite`.

Each check is a test parametrized by accelerator and model (the pin check by
instance too, the random graphs by accelerator only); which accelerators and
models comes from the class's ``umahub_conformance`` marker or, without one,
from ``--umahub-conformance`` and ``--umahub-conformance-models``.

A check whose model did not compile is skipped with the compile's error (the
compile check is the one that fails), so a broken lowering is one failure, not
four.
"""

from __future__ import annotations

from typing import Any

import pytest

from umahub.errors import last_line
from umahub.testing._checking import compare_and_record, compiled_or_skip, fail_if
from umahub.testing._compare import compare
from umahub.testing._device_checks import DEVICE_CHECKS, DeviceChecks
from umahub.testing._options import session_of, suite_options
from umahub.testing._session import UsageProblem

__all__ = ["ConformanceSuite"]


#: The marker that names the accelerator a ConformanceSuite subclass or a fixture checks.
def _taken(report: Any, accelerator: str) -> list[Any]:
    return [o for o in report.placement if o.device.split(":")[0] == accelerator]


def no_operator_taken(
    accelerator: str,
    models: list[str],
    declared: tuple[str, ...],
    present: dict[str, list[str]],
) -> str:
    """Why a run in which ``accelerator`` took no operator of ``models`` fails; "" when it
    does not: it declares its operators and none of the models has any (``present``:
    operator -> the models that have it)."""
    tried = f"{accelerator} took no operator of the models it was given ({', '.join(models)})"
    if not declared:
        return (
            f"{tried}: nothing of it was checked. Make its patterns match these models' "
            f"operators (`umahub explain MODEL` shows the placement), give models that have "
            f"its operators (--umahub-conformance-models=..., or the marker's models=), or "
            f"declare the operators it takes, umahub.Accelerator({accelerator!r}, "
            f"operators=('relax.nn.conv2d', ...)), so that the kit can tell models without "
            f"them from patterns that match nothing"
        )
    found = [f"{op} (in {', '.join(present[op])})" for op in declared if op in present]
    if not found:
        return ""
    return (
        f"{tried}, though they have operators it declares: {', '.join(found)}. Its patterns "
        f"(or their checks) refuse them: `umahub explain MODEL` shows the placement, and "
        f"the partition check which operators it took"
    )


def no_declared_operator(accelerator: str, models: list[str], declared: tuple[str, ...]) -> str:
    """Why the check is skipped: none of ``models`` has an operator ``accelerator`` declares."""
    return (
        f"none of the models it was given ({', '.join(models)}) has an operator {accelerator} "
        f"declares ({', '.join(declared)}): nothing of it was checked on them; give models "
        f"that have them (--umahub-conformance-models=all tries every model of the zoo)"
    )


class ConformanceSuite(DeviceChecks):
    """umahub's conformance checks for an accelerator; subclass it in a test module.

    The accelerator (or plugin), the models and the number of random graphs come
    from the ``umahub_conformance`` marker on the subclass (or its module)::

        @pytest.mark.umahub_conformance(accelerator="npu", models=["mlp", "cnn"], examples=6)
        class TestNpuConformance(ConformanceSuite):
            pass

    and, where it does not say, from the ``--umahub-conformance*`` options. Each
    check records into the session's JSON report (``--umahub-conformance-report``).
    """

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize the checks by accelerator, model and instance."""
        try:
            targets, models, _ = suite_options(metafunc.definition, metafunc.config)
        except UsageProblem as exc:
            pytest.fail(str(exc), pytrace=False)
        names = [n for n in ("accelerator", "model", "instance") if n in metafunc.fixturenames]
        session = session_of(metafunc.config)
        values: list[tuple[Any, ...]] = []
        if metafunc.definition.originalname in DEVICE_CHECKS:  # not for the host's accelerators
            targets = [t for t in targets if t.codegen == "device"]
        for t in targets:
            if "model" not in names:
                values.append((t.accelerator,))
                continue
            for m in session.models_for(t.accelerator, models):
                if "instance" in names:
                    values += [(t.accelerator, m, i) for i in range(t.instances)]
                else:
                    values.append((t.accelerator, m))
        ids = ["-".join(str(v) for v in row) for row in values]
        metafunc.parametrize(names, values, ids=ids)

    # ------------------------------------------------------------------ per model

    def test_partition(self, request: pytest.FixtureRequest, accelerator: str, model: str) -> None:
        """Its patterns partition the model: what it takes is in its partitions, by its patterns."""
        session = session_of(request.config)
        report = session.explained(accelerator, model)
        taken = _taken(report, accelerator)
        partitions = [p for p in report.partitions if p.accelerator == accelerator]
        session.recorder.numbers(
            accelerator,
            model,
            operators_total=len(report.placement),
            operators_taken=len(taken),
            partitions=len(partitions),
        )
        problems = []
        for o in report.placement:
            if o.device != "host" and o.device.split(":")[0] != accelerator:
                problems.append(
                    f"{o.name} ({o.op}) is on {o.device}, but only '{accelerator}' claims"
                )
        for o in taken:
            if not o.pattern.startswith(f"{accelerator}.") or not o.partition:
                problems.append(
                    f"{o.name} ({o.op}) on {o.device} has pattern "
                    f"{o.pattern!r}, partition {o.partition!r}"
                )
        symbols = {p.symbol: p for p in partitions}
        for p in partitions:
            count = sum(o.partition == p.symbol for o in taken)
            if count != p.operators or not p.operators:
                problems.append(
                    f"partition {p.symbol} reports {p.operators} operator(s), "
                    f"the placement puts {count} in it"
                )
        for o in taken:
            if o.partition not in symbols:
                problems.append(
                    f"{o.name} ({o.op}) names partition {o.partition}, which the "
                    "report does not list"
                )
        fail_if("; ".join(problems))

    def test_compile(self, request: pytest.FixtureRequest, accelerator: str, model: str) -> None:
        """Every partition compiles (on-error = "error"), where the plan put it."""
        session = session_of(request.config)
        compiled = session.compiled(accelerator, model)
        fallen = [f"{p.symbol}: {p.fallback}" for p in compiled.report.partitions if p.fallback]
        fail_if(fallen and f"partitions fell back to the host: {'; '.join(fallen)}")
        plan = {o.name: o.device for o in session.explained(accelerator, model).placement}
        built = {o.name: o.device for o in compiled.report.placement}
        moved = [
            f"{n}: planned {plan.get(n)}, built {d}" for n, d in built.items() if plan.get(n) != d
        ]
        fail_if(moved and f"the build placed operators elsewhere than explain: {'; '.join(moved)}")

    def test_matches_host(
        self, request: pytest.FixtureRequest, accelerator: str, model: str
    ) -> None:
        """Its outputs match plain TVM on the host within the kit's tolerance (a quantized
        output: within :data:`~umahub.testing.STEPS` units of its step, 0 by default)."""
        import umahub.models as zoo

        session = session_of(request.config)
        compiled = compiled_or_skip(session, accelerator, model)
        outputs = session.run(compiled, zoo.inputs(model))
        fail_if(compare_and_record(session, accelerator, model, outputs))

    def test_export_and_reload(
        self, request: pytest.FixtureRequest, accelerator: str, model: str, tmp_path: Any
    ) -> None:
        """``export_library`` then :func:`umahub.load` in a fresh runtime gives the same outputs."""
        import umahub
        import umahub.models as zoo

        session = session_of(request.config)
        compiled = compiled_or_skip(session, accelerator, model)
        path = compiled.export_library(tmp_path / f"{model}.so")
        loaded = umahub.load(path)
        fail_if(
            list(loaded.devices) != list(compiled.devices)
            and f"reloaded devices {loaded.devices}, compiled {compiled.devices}"
        )
        outputs = session.run_library(path, zoo.inputs(model))
        fail_if(compare_and_record(session, accelerator, model, outputs, "reloaded output"))

    def test_pin_instance(
        self, request: pytest.FixtureRequest, accelerator: str, model: str, instance: int
    ) -> None:
        """Pinned to one instance it takes the same operators, all on that instance, and matches."""
        import umahub.models as zoo

        session = session_of(request.config)
        used = session.patterns_used(accelerator, model)
        if not used:
            pytest.skip(f"{accelerator} takes no operator of {model}: nothing to pin")
        compiled_or_skip(session, accelerator, model)
        device = f"{accelerator}:{instance}"
        compiled = session.compiled(accelerator, model, instance)
        plan = {o.name for o in _taken(session.explained(accelerator, model), accelerator)}
        taken = _taken(compiled.report, accelerator)
        elsewhere = [f"{o.name} on {o.device}" for o in taken if o.device != device]
        fail_if(elsewhere and f"pinned to {device}, yet {', '.join(elsewhere)}")
        fail_if(
            {o.name for o in taken} != plan
            and f"pinned to {device} it takes {sorted(o.name for o in taken)}, unpinned "
            f"{sorted(plan)}"
        )
        fail_if(
            device not in compiled.devices
            and f"{device} is not among the devices {compiled.devices}"
        )
        outputs = session.run(compiled, zoo.inputs(model))
        fail_if(
            compare_and_record(session, accelerator, model, outputs, f"output pinned to {device}")
        )

    # ------------------------------------------------------------------ over all models

    def test_takes_operators(self, request: pytest.FixtureRequest, accelerator: str) -> None:
        """Over all the models it was given, it takes at least one operator.

        A run where it takes nothing checked nothing of it and fails, unless
        the accelerator declares its operators (``Accelerator(operators=...)``)
        and none of the models has any of them: then the check is skipped and
        says so. A declared name that is not a registered Relax operator fails.
        """
        from umahub.plugin.accelerator import unknown_operators

        session = session_of(request.config)
        _, requested, _ = suite_options(request.node, request.config)
        models = session.models_for(accelerator, requested)
        acc = session.hub(accelerator).accelerator(accelerator)
        fail_if("; ".join(unknown_operators(acc)))
        declared = acc.operators
        present: dict[str, list[str]] = {}  # operator -> the models that have it
        explained = []
        for model in models:
            try:
                report = session.explained(accelerator, model)
            except Exception:  # the partition check fails with the error
                continue
            explained.append(model)
            if _taken(report, accelerator):
                return
            for op in dict.fromkeys(o.op for o in report.placement):
                present.setdefault(op, []).append(model)
        if not explained:
            pytest.skip(f"no model was partitioned for {accelerator} (the partition check fails)")
        fail_if(no_operator_taken(accelerator, explained, declared, present))
        pytest.skip(no_declared_operator(accelerator, explained, declared))

    # ------------------------------------------------------------------ random graphs

    def test_random_graphs(self, request: pytest.FixtureRequest, accelerator: str) -> None:
        """Random small graphs of the operators its patterns name compile and match the host.

        Deterministic (``derandomize=True``), no example database, no shrinking
        (each example is a compile): a failing graph is printed as it was drawn.
        At least one operator must be taken over all the graphs.
        """
        pytest.importorskip(
            "hypothesis", reason="random graphs need hypothesis (pip install 'umahub[test]')"
        )
        from hypothesis import given

        from umahub.testing._graphs import (
            accelerator_ops,
            build,
            graph_inputs,
            graphs,
            kit_settings,
            vocabulary,
        )
        from umahub.testing._session import host_outputs

        session = session_of(request.config)
        _, _, examples = suite_options(request.node, request.config)
        hub = session.hub(accelerator)
        mentioned = accelerator_ops(hub, accelerator)
        ops = vocabulary(mentioned)
        record = session.recorder
        record.numbers(
            accelerator,
            None,
            vocabulary=list(ops),
            examples=0,
            graphs_taken=0,
            operators_total=0,
            operators_taken=0,
        )
        if not ops:
            pytest.skip(
                f"the patterns of {accelerator} mention no operator the graph "
                f"generator knows (they mention: {', '.join(sorted(mentioned)) or 'none'})"
            )
        seen: dict[str, tuple[int, int]] = {}

        @kit_settings(examples)
        @given(graphs(ops))
        def check(spec: Any) -> None:
            mod, xs = build(spec), graph_inputs(spec)
            try:
                compiled = hub.compile(mod)
            except Exception as exc:
                raise AssertionError(
                    f"{spec!r} did not compile: {type(exc).__name__}: {last_line(exc)}"
                ) from exc
            taken = len(_taken(compiled.report, accelerator))
            seen[repr(spec)] = (len(compiled.report.placement), taken)
            largest, problem = compare(compiled.run(*xs), host_outputs(mod, xs), repr(spec))
            record.error(accelerator, None, largest)
            fail_if(problem)

        try:
            check()
        finally:
            record.numbers(
                accelerator,
                None,
                examples=len(seen),
                graphs_taken=sum(1 for _, t in seen.values() if t),
                operators_total=sum(n for n, _ in seen.values()),
                operators_taken=sum(t for _, t in seen.values()),
            )
        fail_if(
            not any(t for _, t in seen.values())
            and f"{accelerator} took no operator of {len(seen)} random graph(s) of "
            f"{', '.join(ops)}: its pattern checks refuse every small float32 case"
        )
