"""The pytest hooks and fixtures of the conformance kit (loaded by the ``pytest11`` entry point).

Without ``--umahub-conformance`` the hooks only add the options and the marker:
nothing of TVM, the zoo or the plugins is imported until a fixture of the kit
is requested or a :class:`~umahub.testing.ConformanceSuite` is collected.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from umahub.testing._cross import CrossConformanceSuite
from umahub.testing._options import SESSION_KEY
from umahub.testing._report import WHOLE
from umahub.testing._session import (
    DEFAULT_EXAMPLES,
    DEFAULT_MODELS,
    ConformanceSession,
    UsageProblem,
)
from umahub.testing._suite import ConformanceSuite

__all__ = [
    "SESSION_KEY",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_itemcollected",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "umahub_conformance_accelerator",
    "umahub_conformance_hub",
    "umahub_conformance_report",
    "umahub_host_reference",
]

#: (accelerator, model or None, check) of a conformance test item.
_CASE_KEY = pytest.StashKey[tuple[str, Any, str]]()
#: The checks of an accelerator over all its models (recorded under ``all_models``).
_WHOLE_CHECKS = frozenset({"takes_operators"})
#: The accelerators (joined by "+") of a cross-accelerator test item.
_CROSS_KEY = pytest.StashKey[str]()

#: How many device checks a run deselected (no accelerator under test has a device).
_NOT_APPLICABLE_KEY = pytest.StashKey[int]()

_REPORT_NAME = "umahub-conformance.json"
#: The node id of the added test module: ``umahub-conformance::TestConformance::test_...``.
_SUITE_NODEID = "umahub-conformance"


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--umahub-conformance*`` options."""
    group = parser.getgroup("umahub", "umahub conformance kit")
    group.addoption(
        "--umahub-conformance",
        metavar="NAME[,NAME]",
        default=None,
        help="run umahub's conformance checks for these umahub plugins or accelerators "
        "(a plugin means all its accelerators)",
    )
    group.addoption(
        "--umahub-conformance-models",
        metavar="LIST",
        default=",".join(DEFAULT_MODELS),
        help="zoo models to check, comma-separated, or 'all' (default: %(default)s; an "
        "accelerator whose patterns take R.quantize or R.dequantize also gets their _int8 "
        "variants)",
    )
    group.addoption(
        "--umahub-conformance-report",
        metavar="PATH",
        default=None,
        help=f"where to write the JSON report (default: {_REPORT_NAME} in the rootdir)",
    )
    group.addoption(
        "--umahub-conformance-examples",
        metavar="N",
        type=int,
        default=DEFAULT_EXAMPLES,
        help="random graphs per accelerator (hypothesis examples; default: %(default)s)",
    )
    group.addoption(
        "--umahub-conformance-cross",
        action="store_true",
        default=False,
        help="also check the accelerators of --umahub-conformance together: random graphs "
        "over all their operators, random pins to any of them, any instance or the host",
    )
    group.addoption(
        "--umahub-rpc",
        metavar="HOST:PORT",
        default=None,
        help="run the numeric checks on a board from this TVM tracker (with --umahub-rpc-key)",
    )
    group.addoption(
        "--umahub-rpc-key",
        metavar="KEY",
        default=None,
        help="the kind of board to ask the --umahub-rpc tracker for",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; resolve ``--umahub-conformance`` (a usage error if unknown)."""
    config.addinivalue_line(
        "markers",
        "umahub_conformance(accelerator, models=None, examples=None): the umahub accelerator "
        "(or plugin) that the kit's fixtures and a ConformanceSuite subclass check",
    )
    names = _split(config.getoption("umahub_conformance", None))
    explicit_report = config.getoption("umahub_conformance_report", None)
    report = None
    if names or explicit_report:
        report = Path(explicit_report) if explicit_report else config.rootpath / _REPORT_NAME
    examples = config.getoption("umahub_conformance_examples", DEFAULT_EXAMPLES)
    if examples < 1:
        raise pytest.UsageError(f"--umahub-conformance-examples={examples}: must be at least 1")
    session = ConformanceSession(
        names,
        _split(config.getoption("umahub_conformance_models", None)) or DEFAULT_MODELS,
        examples,
        report,
        cross=bool(config.getoption("umahub_conformance_cross", False)),
        rpc=_rpc(config),
    )
    if session.cross and not names:
        raise pytest.UsageError(
            "--umahub-conformance-cross needs the accelerators to check together: "
            "--umahub-conformance=NAME,NAME"
        )
    config.stash[SESSION_KEY] = session
    if names:
        try:
            session.targets  # noqa: B018 - resolve now: an unknown name is a usage error
            session.models()
        except UsageProblem as exc:
            raise pytest.UsageError(str(exc)) from None


def _rpc(config: pytest.Config) -> tuple[str, str] | None:
    tracker = config.getoption("umahub_rpc", None)
    key = config.getoption("umahub_rpc_key", None)
    if bool(tracker) != bool(key):
        raise pytest.UsageError(
            "--umahub-rpc HOST:PORT and --umahub-rpc-key KEY go together: the tracker, and "
            "the kind of board to ask it for"
        )
    return (tracker, key) if tracker else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """With ``--umahub-conformance``, add the suite's tests to the session.

    The cross-accelerator check only with ``--umahub-conformance-cross``. Runs
    first, so that ``-k``, ``-m`` and other plugins see the added tests as if
    they had been collected from a file.
    """
    dropped = [item for item in items if _not_applicable(item)]  # a vendor's subclass too
    if dropped:
        # Deselected, as pytest counts them: "collected 16 items / 3 deselected", not
        # 16 collected and 13 passed with nothing said of the other 3.
        items[:] = [item for item in items if not _not_applicable(item)]
        config.hook.pytest_deselected(items=dropped)
        config.stash[_NOT_APPLICABLE_KEY] = len(dropped)
    state = config.stash[SESSION_KEY]
    if not state.names:
        return
    from umahub.testing import conformance

    # A fixed node id: the module's path may be anywhere (site-packages, an
    # editable checkout), and the ids should read the same everywhere.
    module = pytest.Module.from_parent(
        session, path=Path(conformance.__file__), nodeid=_SUITE_NODEID
    )
    items.extend(
        item
        for item in session.genitems(module)
        if (
            state.cross
            or not issubclass(getattr(item, "cls", None) or object, CrossConformanceSuite)
        )
        and not _not_applicable(item)
    )


def _not_applicable(item: pytest.Item) -> bool:
    """A check of a device of its own when no accelerator under test has one (pytest's
    placeholder for an empty parametrization): deselected, rather than skipped."""
    from umahub.testing._device_checks import DEVICE_CHECKS

    params = getattr(getattr(item, "callspec", None), "params", {})
    return getattr(item, "originalname", "") in DEVICE_CHECKS and not isinstance(
        params.get("accelerator"), str
    )


def pytest_itemcollected(item: pytest.Item) -> None:
    """Tag the tests of a ConformanceSuite with (accelerator, model, check) for the report."""
    cls = getattr(item, "cls", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if cls is not None and issubclass(cls, CrossConformanceSuite) and "accelerators" in params:
        item.stash[_CROSS_KEY] = params["accelerators"]
        return
    if cls is None or not issubclass(cls, ConformanceSuite):
        return
    if "accelerator" not in params or not isinstance(item, pytest.Function):
        return
    check = item.originalname.removeprefix("test_")
    if "instance" in params:
        check = f"{check}:{params['instance']}"
    model = WHOLE if check in _WHOLE_CHECKS else params.get("model")
    item.stash[_CASE_KEY] = (params["accelerator"], model, check)


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    text = text.strip().removeprefix("AssertionError: ").removeprefix("Skipped: ")
    lines = [line for line in text.splitlines() if line.strip()]
    text = lines[0] if lines else text
    return text if len(text) <= 600 else text[:597] + "..."


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Record the outcome of every conformance check (and its message) for the report."""
    report = yield
    cross = item.stash.get(_CROSS_KEY, None)
    if cross is not None and (report.when == "call" or not report.passed):
        message = "" if report.passed else _message(report)
        item.config.stash[SESSION_KEY].recorder.cross_outcome(cross, report.outcome, message)
    case = item.stash.get(_CASE_KEY, None)
    if case is not None and (report.when == "call" or not report.passed):
        accelerator, model, check = case
        session = item.config.stash[SESSION_KEY]
        target = session.target(accelerator)
        session.recorder.accelerator(
            accelerator, plugin=target.plugin, instances=target.instances, codegen=target.codegen
        )
        message = "" if report.passed else _message(report)
        session.recorder.outcome(accelerator, model, check, report.outcome, message)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the JSON report, when asked for and when some check ran."""
    state = session.config.stash.get(SESSION_KEY, None)
    if state is None or state.report_path is None or not state.recorder:
        return
    from umahub.testing._compare import STEPS, TOLERANCE

    state.recorder.write(
        state.report_path,
        TOLERANCE.to_dict(),
        steps=STEPS.to_dict(),
        options={
            "conformance": list(state.names),
            "models": list(state.requested_models),
            "examples": state.examples,
            **({"cross": True} if state.cross else {}),
        },
    )


def _units_word(count: int) -> str:
    return "unit" if count == 1 else "units"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """A short table per accelerator and model, and where the report is."""
    state = config.stash.get(SESSION_KEY, None)
    if state is None or not state.recorder:
        return
    from umahub.testing._compare import TOLERANCE

    data = state.recorder.to_dict(TOLERANCE.to_dict())
    terminalreporter.section("umahub conformance")
    for name, acc in data["accelerators"].items():
        verdict = "passed" if acc["passed"] else "FAILED"
        terminalreporter.write_line(f"{name} (plugin {acc.get('plugin', '?')}): {verdict}")
        whole = acc.get("all_models")
        if whole is not None and not whole["passed"]:
            terminalreporter.write_line(
                f"  {'all models':<16} FAILED: {'; '.join(whole['failures'])}"
            )
        elif whole is not None and whole["notes"]:
            terminalreporter.write_line(f"  {'all models':<16} {'; '.join(whole['notes'])}")
        rows = list(acc["models"].items())
        if "random_graphs" in acc:
            rows.append(("random graphs", acc["random_graphs"]))
        for model, entry in rows:
            taken = entry.get("operators_taken")
            total = entry.get("operators_total")
            error = entry["largest_error"]
            units = entry.get("largest_units")
            terminalreporter.write_line(
                f"  {model:<16} took {'?' if taken is None else taken}/"
                f"{'?' if total is None else total} ops, largest error "
                f"{'-' if error is None else f'{error:.2g}'}"
                f"{'' if units is None else f' ({units} {_units_word(units)})'}, "
                f"{'passed' if entry['passed'] else 'FAILED: ' + '; '.join(entry['failures'])}"
            )
    for name, entry in data.get("cross", {}).items():
        error = entry["largest_error"]
        terminalreporter.write_line(
            f"{name} together: {entry.get('examples', 0)} random graph(s), took "
            f"{entry.get('operators_taken', 0)}/{entry.get('operators_total', 0)} ops, "
            f"{entry.get('pins', 0)} pin(s) ({entry.get('pins_unhonoured', 0)} not honourable), "
            f"largest error {'-' if error is None else f'{error:.2g}'}, "
            f"{'passed' if entry['passed'] else 'FAILED: ' + '; '.join(entry['failures'])}"
        )
    dropped = config.stash.get(_NOT_APPLICABLE_KEY, 0)
    if dropped:
        terminalreporter.write_line(
            f"{dropped} device check{'s' if dropped > 1 else ''} deselected: no accelerator "
            "under test has a device of its own (Accelerator(runtime=...))"
        )
    if state.report_path is not None:
        terminalreporter.write_line(f"report: {state.report_path}")


# ---------------------------------------------------------------------- fixtures


def _session(request: pytest.FixtureRequest) -> ConformanceSession:
    return request.config.stash[SESSION_KEY]


@pytest.fixture
def umahub_conformance_accelerator(request: pytest.FixtureRequest) -> str:
    """The accelerator under test: the ``umahub_conformance`` marker's, else the option's.

    Exactly one accelerator must be meant (a plugin with one accelerator is fine).
    """
    from umahub.testing._options import suite_options

    try:
        targets, _, _ = suite_options(request.node, request.config)
    except UsageProblem as exc:
        pytest.fail(str(exc), pytrace=False)
    if len(targets) != 1:
        pytest.fail(
            f"umahub_conformance_accelerator: {len(targets)} accelerators are meant "
            f"({', '.join(t.accelerator for t in targets)}); name one",
            pytrace=False,
        )
    return targets[0].accelerator


@pytest.fixture
def umahub_conformance_hub(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A factory ``make(accelerator=None, **config) -> umahub.Hub``.

    The hub loads only the accelerator's plugin, lets only that accelerator
    claim, and stops the compile on any plugin failure (``on-error = "error"``);
    the project's ``[tool.umahub]`` cannot change that. ``accelerator``
    defaults to :func:`umahub_conformance_accelerator`'s; ``config`` adds
    ``[tool.umahub]`` keys (``placement={...}``, ``scope-policy="outputs"``).
    """

    def make(accelerator: str | None = None, **config: Any) -> Any:
        name = accelerator or request.getfixturevalue("umahub_conformance_accelerator")
        try:
            return _session(request).hub(name, {k.replace("_", "-"): v for k, v in config.items()})
        except UsageProblem as exc:
            pytest.fail(str(exc), pytrace=False)

    return make


@pytest.fixture(scope="session")
def umahub_host_reference(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """``reference(model_name)``: the outputs of plain ``tvm.compile(target="llvm")`` on the
    zoo model's ``inputs(name, seed=0)``, computed once per session."""
    return _session(request).reference


@pytest.fixture(scope="session")
def umahub_conformance_report(request: pytest.FixtureRequest) -> Any:
    """The session's report recorder: ``numbers(accel, model, ...)``, ``error(accel, model,
    value)``, ``outcome(accel, model, check, outcome, message)``."""
    return _session(request).recorder
