"""Placement by cost (``priority = "auto"``, ``placement="auto"``): umahub.auto.

The search is tested on its own (no TVM) against hand-worked problems; the
pipeline with small plugins whose ``umahub_cost`` fixes the accelerator's
side, so that the choice is known whatever this machine measures for the host.
"""

from __future__ import annotations

import json
import random
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
from graphs import chain, inputs_for, reference

import umahub
from umahub.auto.cache import FILE, CostCache
from umahub.auto.search import Assignment, Candidate, Problem, greedy, solve
from umahub.errors import ConfigError


def _plugin(costs: dict[str, object] | None, bandwidth: float | None = 1e10, name: str = "fast"):
    """An accelerator ``name`` taking relu and add, its cost per pattern from ``costs``
    (a pattern absent: no estimate, measured)."""
    from tvm.relax.dpl import is_op, wildcard

    class Fast:
        UMAHUB_API = 1
        calls: list = []

        @umahub.hookimpl
        def umahub_accelerators(self):
            pools = [umahub.MemoryPool(f"{name}.mem", 1 << 20, bandwidth=bandwidth)]
            return [umahub.Accelerator(name, memory=pools)]

        @umahub.hookimpl(accelerator=name)
        def umahub_patterns(self):
            return [
                (f"{name}.relu", is_op("relax.nn.relu")(wildcard())),
                (f"{name}.add", is_op("relax.add")(wildcard(), wildcard())),
            ]

        @umahub.hookimpl(accelerator=name)
        def umahub_cost(self, function, context):
            Fast.calls.append(context.patterns)
            if costs is None:
                return None
            value = costs.get(context.patterns[0])
            if isinstance(value, Exception):
                raise value
            return value

    return Fast()


def _hub(plugin, **config):
    return umahub.Hub(autoload=False, plugins=[plugin], project_config=False, config=config)


def _devices(compiled):
    return {o.name: o.device for o in compiled.report.placement}


RELU_ADD = ("relu", "add", "relu", "add", "sigmoid")


# --------------------------------------------------------------------------- the pipeline


def test_a_cost_model_that_makes_the_host_cheaper_leaves_that_group_on_the_host():
    mod = chain(ops=RELU_ADD)
    hub = _hub(_plugin({"fast.relu": 10.0, "fast.add": 1e-9}))
    by_priority = hub.compile(mod)
    assert set(_devices(by_priority).values()) == {"fast:0", "host"}
    assert _devices(by_priority)["n0"] == "fast:0"

    compiled = hub.compile(mod, placement="auto")
    assert _devices(compiled) == {
        "n0": "host",
        "n1": "fast:0",
        "n2": "host",
        "n3": "fast:0",
        "n4": "host",
    }
    auto = compiled.report.auto
    assert auto["changed"] == {"n0": ["fast", "host"], "n2": ["fast", "host"]}
    relu = next(g for g in auto["groups"] if g["nodes"] == ["n0"])
    assert relu["chosen"] is False and relu["by_priority"] is True
    assert relu["costs"]["fast"] == {"seconds": 10.0, "source": f"plugin {_name(hub)}"}
    assert relu["costs"]["host"]["source"] == "measured"
    assert relu["why"].startswith(f"fast 10000.000 ms (cost model of {_name(hub)}), host ")
    assert " ms (measured); " in relu["why"]
    assert "taking it would cost" in relu["why"]
    assert auto["costs"] == {"plugin": 2, "measured": 2, "cached": 0, "none": 0}
    assert auto["estimate_ms"] <= min(auto["baselines_ms"].values())
    assert json.loads(compiled.report.to_json())["auto"]["changed"] == auto["changed"]
    inputs = inputs_for(mod)
    np.testing.assert_allclose(compiled.run(*inputs), reference(mod, inputs), rtol=1e-5, atol=1e-6)


def _name(hub):
    return hub.plugins[0].name


def test_priority_auto_in_the_config_places_by_cost_and_placement_priority_overrides_it():
    mod = chain(ops=RELU_ADD)
    hub = _hub(_plugin({"fast.relu": 10.0, "fast.add": 1e-9}), priority="auto")
    assert hub.config.placement_auto and hub.config.priority is None
    assert _devices(hub.compile(mod))["n0"] == "host"
    by_priority = hub.compile(mod, placement="priority")
    assert _devices(by_priority)["n0"] == "fast:0"
    assert by_priority.report.auto is None


def test_a_pin_wins_over_the_cost():
    mod = chain(ops=RELU_ADD)
    hub = _hub(
        _plugin({"fast.relu": 10.0, "fast.add": 1e-9}),
        priority="auto",
        placement={"n2": "fast", "n3": "host"},
    )
    devices = _devices(hub.compile(mod))
    assert devices == {"n0": "host", "n1": "fast:0", "n2": "fast:0", "n3": "host", "n4": "host"}
    auto = hub.explain(mod).auto
    pinned = next(g for g in auto["groups"] if g["nodes"] == ["n2"])
    assert pinned["why"] == "pinned to it" and pinned["chosen"] is True
    assert not any(g["nodes"] == ["n3"] for g in auto["groups"])  # pinned to the host


def test_the_second_compile_uses_the_measurements_of_the_first(isolated):
    mod = chain(ops=("relu", "add", "sigmoid"))
    first = _hub(_plugin(None)).compile(mod, placement="auto").report.auto
    assert first["costs"] == {"plugin": 0, "measured": 4, "cached": 0, "none": 0}
    assert first["cache"]["path"] == str(isolated / "umahub-cache" / FILE)
    entries = json.loads((isolated / "umahub-cache" / FILE).read_text())["entries"]
    # the four groups' costs, and the verdict of the choice against the other placements
    assert len(entries) == 5
    assert first["finalists"]["cached"] is False
    assert sorted(first["finalists"]) == ["cached", "contenders", "kept", "measured_ms", "tie"]
    # the contenders the estimate's known error could make winners (measured: which they are)
    near = first["finalists"]["contenders"]
    assert near == [c for c in first["contenders"] if c in near]
    assert sorted(first["finalists"]["measured_ms"]) == sorted(["auto", *near])
    again = _hub(_plugin(None)).compile(mod, placement="auto").report.auto
    assert again["costs"] == {"plugin": 0, "measured": 0, "cached": 4, "none": 0}
    assert again["cache"]["hits"] == 4 and again["cache"]["misses"] == 0
    assert again["finalists"] == {**first["finalists"], "cached": True}  # not timed again
    for before, after in zip(first["groups"], again["groups"]):
        assert before["costs"]["fast"]["seconds"] == after["costs"]["fast"]["seconds"]
        assert after["costs"]["fast"]["source"] == "cached"


def test_a_damaged_cache_is_set_aside_with_a_warning_and_measured_again(isolated):
    cache = isolated / "umahub-cache"
    cache.mkdir()
    (cache / FILE).write_text("{not json")
    mod = chain(ops=("relu",))
    with pytest.warns(umahub.UmahubWarning, match=r"cost cache .* is damaged .* set aside as"):
        auto = _hub(_plugin(None)).compile(mod, placement="auto").report.auto
    assert auto["costs"]["measured"] == 2
    assert (cache / (FILE + ".damaged")).read_text() == "{not json"
    assert json.loads((cache / FILE).read_text())["format"] == 1


@pytest.mark.parametrize(
    "value, said",
    [
        (-1.0, "it returned -1.0, not a finite number of seconds >= 0"),
        ("fast", "it returned 'fast', not a finite number of seconds >= 0"),
        (float("nan"), "it returned nan, not a finite number of seconds >= 0"),
        (KeyError("tile"), "KeyError: 'tile'"),
    ],
)
def test_a_cost_that_is_no_number_of_seconds_is_a_plugin_failure_and_measured_instead(value, said):
    hub = _hub(_plugin({"fast.relu": value}))
    with pytest.warns(umahub.UmahubWarning) as caught:
        compiled = hub.compile(chain(ops=("relu",)), placement="auto")
    messages = [str(w.message) for w in caught]
    expected = (
        f"umahub: plugin '{_name(hub)}' failed in umahub_cost for accelerator 'fast' on n0: "
        f"{said}; the group is measured instead"
    )
    assert expected in messages
    assert compiled.report.auto["groups"][0]["costs"]["fast"]["source"] == "measured"


def test_a_cost_that_is_no_number_stops_the_compile_with_on_error_error():
    hub = _hub(_plugin({"fast.relu": -1.0}), on_error="error")
    with pytest.raises(umahub.errors.CompileError, match="failed in umahub_cost"):
        hub.compile(chain(ops=("relu",)), placement="auto")


def test_placement_takes_auto_priority_or_pins_and_names_what_it_takes():
    hub = _hub(_plugin(None))
    with pytest.raises(ConfigError) as err:
        hub.compile(chain(ops=("relu",)), placement="atuo")
    assert str(err.value) == (
        "placement='atuo' (did you mean 'auto'?): placement takes \"auto\" (placement by cost), "
        '"priority" (the config\'s priority order) or a mapping of pins, {"conv1": "npu"}'
    )


def test_priority_as_a_string_other_than_auto_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        umahub.Hub(autoload=False, project_config=False, config={"priority": "fast"})
    assert str(err.value) == (
        'config=: [tool.umahub] priority: expected a list of accelerators or "auto" '
        "(placement by cost), got 'fast'"
    )


def test_a_pool_bandwidth_must_be_a_positive_number():
    with pytest.raises(ValueError, match=r"bandwidth must be a positive number of bytes"):
        umahub.MemoryPool("x.mem", 1024, bandwidth=0)


def test_explain_auto_shows_the_choice_without_building(capsys, tmp_path):
    from umahub.cli.summary import summary

    mod = chain(ops=RELU_ADD)
    hub = _hub(_plugin({"fast.relu": 10.0, "fast.add": 1e-9}))
    report = hub.explain(mod, placement="auto")
    text = str(report)
    assert "placement by cost:" in text
    assert "    n0: fast -> host" in text
    assert "(configured)" in text
    assert report.built is False
    line = summary(report, 1.0).splitlines()[2]
    assert line.startswith("placement by cost: estimated ")
    assert "2 operators placed otherwise than by priority; costs: 2 plugin, 2 measured" in line
    svg = report.save_picture(str(tmp_path / "auto.svg"))
    assert 'data-priority-device="fast"' in (tmp_path / "auto.svg").read_text()
    assert svg


# --------------------------------------------------------------------------- the search


def _copy(src, dst, size):
    return 1e-3 * size  # a millisecond per byte: copies matter


def _middle_on_acc(**options) -> Problem:
    """a -> b -> c; only b can go to the accelerator; it saves 1.5 ms there, but
    moving its 1-byte input and output costs 2 ms."""
    return Problem(
        nodes=["a", "b", "c"],
        inputs={"b": ["a"], "c": ["b"]},
        bytes={"a": 1, "b": 1, "c": 1},
        host={"a": 1e-3, "b": 2e-3, "c": 1e-3},
        candidates=[Candidate("acc", ("b",), 0.5e-3)],
        copy_seconds=_copy,
        outputs=frozenset({"c"}),
        **options,
    )


def test_copies_decide_when_the_accelerator_saves_less_than_they_cost():
    problem = _middle_on_acc(executor="vm")
    solution = solve(problem, ["acc"])
    assert solution.assignment.chosen == set()
    assert solution.baselines["priority acc"] == pytest.approx(4.5e-3)
    assert solution.estimate == pytest.approx(4e-3)


def test_the_vm_pays_no_copy_to_an_accelerator_in_the_hosts_memory():
    # acc in the host's memory: the 1.5 ms it saves cost the VM no copy
    problem = _middle_on_acc(executor="auto", shared_memory=frozenset({"acc"}))
    assert Assignment(problem, [0]).sequential() == pytest.approx(2.5e-3)
    # the concurrent executor still copies (its copy steps)
    assert Assignment(problem, [0]).concurrent() == pytest.approx(4.5e-3)
    solution = solve(problem, ["acc"])
    assert solution.assignment.chosen == {0}
    assert solution.estimate == pytest.approx(2.5e-3)


def test_two_neighbours_on_one_accelerator_pay_one_copy_each_way():
    problem = Problem(
        nodes=["a", "b", "c", "d"],
        inputs={"b": ["a"], "c": ["b"], "d": ["c"]},
        bytes={n: 1 for n in "abcd"},
        host={n: 2e-3 for n in "abcd"},
        candidates=[Candidate("acc", ("b",), 0.5e-3), Candidate("acc", ("c",), 0.5e-3)],
        copy_seconds=_copy,
        outputs=frozenset({"d"}),
        executor="vm",
    )
    # alone, each saves 1.5 ms and costs 2 ms of copies; together they save 3 for 2
    assert Assignment(problem, [0]).sequential() == pytest.approx(8.5e-3)
    solution = solve(problem)
    assert solution.assignment.chosen == {0, 1}
    assert solution.estimate == pytest.approx(7e-3)


def test_the_concurrent_estimate_overlaps_independent_branches():
    # x feeds two branches of 4 ms each; on host and acc at once they take 4 ms, not 8.
    problem = Problem(
        nodes=["x", "left", "right", "join"],
        inputs={"left": ["x"], "right": ["x"], "join": ["left", "right"]},
        bytes={n: 0 for n in ("x", "left", "right", "join")},
        host={"x": 0.0, "left": 4e-3, "right": 4e-3, "join": 0.0},
        candidates=[Candidate("acc", ("right",), 4e-3)],
        copy_seconds=lambda s, d, b: 0.0,
        outputs=frozenset({"join"}),
        executor="auto",
    )
    assert Assignment(problem, [0]).sequential() == pytest.approx(8e-3)
    assert Assignment(problem, [0]).concurrent() == pytest.approx(4e-3)
    assert solve(problem).estimate == pytest.approx(4e-3)


def _random_problem(seed: int, n: int = 60) -> Problem:
    rng = random.Random(seed)
    nodes = [f"v{i}" for i in range(n)]
    inputs = {
        v: [nodes[j] for j in {max(0, i - 1), rng.randrange(max(1, i))} if j < i]
        for i, v in enumerate(nodes)
    }
    candidates = []
    for accel in ("a", "b", "c"):
        i = 0
        while i < n:
            size = rng.randint(1, 3)
            if rng.random() < 0.6:
                group = tuple(nodes[i : i + size])
                candidates.append(Candidate(accel, group, rng.uniform(0.1, 3.0) * len(group)))
            i += size
    return Problem(
        nodes=nodes,
        inputs=inputs,
        bytes={v: rng.randint(1, 1000) for v in nodes},
        host={v: rng.uniform(0.5, 3.0) for v in nodes},
        candidates=candidates,
        copy_seconds=lambda s, d, b: b * 1e-3,
        copy_kind={"a": "sync", "b": "async", "c": "sync"},
        instances={"a": 1, "b": 2, "c": 1},
        outputs=frozenset({nodes[-1]}),
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_choice_is_never_estimated_worse_than_any_claiming_order_or_single_accelerator(seed):
    problem = _random_problem(seed)
    solution = solve(problem, ["a", "b", "c"])
    assert len(solution.baselines) == 6 + 3 + 1
    assert solution.estimate <= min(solution.baselines.values()) + 1e-12
    chosen = solution.assignment
    owners = [n for i in chosen.chosen for n in problem.candidates[i].nodes]
    assert len(owners) == len(set(owners))  # no operator in two chosen groups
    assert solution.estimate == pytest.approx(chosen.estimate())


def test_greedy_is_what_a_claiming_order_takes():
    problem = Problem(
        nodes=["a", "b", "c"],
        inputs={"b": ["a"], "c": ["b"]},
        bytes={},
        host={},
        candidates=[
            Candidate("x", ("a", "b"), 1.0),
            Candidate("y", ("b", "c"), 1.0),
            Candidate("y", ("a",), 1.0),
        ],
        copy_seconds=lambda s, d, b: 0.0,
    )
    assert greedy(problem, ["x", "y"]).devices() == {"a": "x", "b": "x", "c": "host"}
    assert greedy(problem, ["y", "x"]).devices() == {"a": "y", "b": "y", "c": "y"}


def test_ten_thousand_operators_are_searched():
    # 10,000 operators in a chain with skip connections; the accelerator is
    # faster for every even operator, and copies are free: it takes exactly those.
    n = 10_000
    nodes = [f"v{i}" for i in range(n)]
    problem = Problem(
        nodes=nodes,
        inputs={
            v: [nodes[i - 1]] + ([nodes[i - 7]] if i >= 7 else []) for i, v in enumerate(nodes) if i
        },
        bytes={v: 4096 for v in nodes},
        host={v: 1e-4 for v in nodes},
        candidates=[
            Candidate("acc", (v,), 5e-5 if i % 2 == 0 else 2e-4) for i, v in enumerate(nodes)
        ],
        copy_seconds=lambda s, d, b: 0.0,
        outputs=frozenset({nodes[-1]}),
        executor="vm",
    )
    solution = solve(problem, ["acc"])
    assert {problem.candidates[i].nodes[0] for i in solution.assignment.chosen} == set(nodes[::2])
    assert solution.estimate == pytest.approx(n / 2 * 5e-5 + n / 2 * 1e-4)


def test_the_cache_keeps_what_another_process_wrote(tmp_path):
    one, two = CostCache(tmp_path), CostCache(tmp_path)
    one.put("a", {"seconds": 1.0})
    one.save()
    two.put("b", {"seconds": 2.0})
    two.save()
    assert set(CostCache(tmp_path).entries) == {"a", "b"}


def test_by_cost_every_match_is_a_partition_of_its_own_as_it_was_timed():
    mod = chain(ops=RELU_ADD)
    hub = _hub(_plugin({"fast.relu": 1e-9, "fast.add": 1e-9}))
    assert len(hub.compile(mod).report.partitions) == 1  # "fast" merges its neighbours
    compiled = hub.compile(mod, placement="auto")
    assert [p.operators for p in compiled.report.partitions] == [1, 1, 1, 1]
    assert {o.device for o in compiled.report.placement if o.name != "n4"} == {"fast:0"}


def test_copies_are_fitted_as_a_latency_and_a_bandwidth():
    from umahub.auto.costs import _fit

    # 10 us each, plus 1 GB/s: the small copies give the latency, the large the bandwidth
    samples = [(size, 10e-6 + size / 1e9) for size in (16, 64, 256, 1 << 20, 4 << 20, 16 << 20)]
    latency, bandwidth = _fit(samples)
    assert latency == pytest.approx(10e-6, rel=0.01)
    assert bandwidth == pytest.approx(1e9, rel=0.01)
    assert _fit([(16, 5e-6), (32, 5e-6)]) == (5e-6, float("inf"))  # no large copy: no bandwidth
    # copies of at most 4 KiB, one of them 3 us slower than the rest (noise): their
    # "rate" is the noise's, not a bandwidth (once 0.08 GB/s for the DSP)
    noisy = [(32, 3e-6)] * 8 + [(480, 3.1e-6)] * 8 + [(4096, 6e-6)]
    assert _fit(noisy) == (3e-6, float("inf"))


def test_the_cost_cache_key_changes_when_a_plugins_source_changes(tmp_path, monkeypatch):
    # a development install keeps its version while its kernels change: its
    # measured costs must not be reused
    from umahub.auto.cache import code_fingerprint

    package = tmp_path / "edited_plugin"
    package.mkdir()
    (package / "__init__.py").write_text("UMAHUB_API = 1\n")
    (package / "kernels.py").write_text("TILE = 16\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_plugin

    before = code_fingerprint([edited_plugin])
    assert code_fingerprint([edited_plugin]) == before
    (package / "kernels.py").write_text("TILE = 32  # faster\n")
    assert code_fingerprint([edited_plugin]) != before


# --------------------------------------------------------------------------- finalists


def _two(**config):
    """A hub with two accelerators that both take relu and add: fast and slow."""
    fast, slow = _plugin(None), _plugin(None, name="slow")
    fast.UMAHUB_NAME, slow.UMAHUB_NAME = "fast", "slow"
    return umahub.Hub(autoload=False, plugins=[fast, slow], project_config=False, config=config)


def test_the_choice_meets_every_contender_and_the_fastest_is_kept(isolated, monkeypatch):
    from umahub.auto import finalists

    mod = chain(ops=RELU_ADD)
    hub = _two()
    contenders = hub.compile(mod, placement="auto").report.auto["contenders"]
    assert len(contenders) >= 2  # fast alone, slow alone, host alone: three placements
    first, second = contenders[:2]
    # scripted: the first contender beats the choice, the second beats the first
    matches = iter(
        [(0.004, 0.002, [0.5] * 7), (0.002, 0.001, [0.5] * 7)] + [(0.001, 0.003, [3.0] * 7)] * 8
    )
    monkeypatch.setattr(finalists, "_match", lambda a, b, xs: next(matches))
    monkeypatch.setattr(finalists, "cached_winner", lambda comp, cache: None)
    monkeypatch.setattr(finalists, "WITHIN", float("inf"))  # every contender, however estimated
    kept = hub.compile(mod, placement="auto")
    verdict = kept.report.auto["finalists"]
    assert verdict["kept"] == second and verdict["cached"] is False
    assert verdict["contenders"] == contenders
    assert verdict["measured_ms"] == {
        "auto": 4.0,
        first: 2.0,
        second: 1.0,
        **{name: 3.0 for name in contenders[2:]},
    }
    # what runs is what that starting point builds, and the report says why
    order = finalists.accelerators_of(second)
    if order:
        expected = _devices(_two(priority=list(order)).compile(mod))
    else:  # "host alone"
        expected = {name: "host" for name in _devices(kept)}
    assert _devices(kept) == expected
    assert (
        f"placement by cost: {second} ran in 1 ms, the estimated choice in 4 ms: {second} is kept"
    ) in kept.report.notes
    times = ", ".join(
        [f"{second} 1.000 ms", f"{first} 2.000 ms"]
        + [f"{name} 3.000 ms" for name in contenders[2:]]
        + ["the choice 4.000 ms"]
    )
    assert f"  measured: {times}: {second} is kept" in str(kept.report).splitlines()
    xs = inputs_for(mod)
    np.testing.assert_allclose(kept.run(*xs), reference(mod, xs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("ops", "matches", "contenders"),
    [
        # relu feeds add: "priority fast" lowers the two as one partition, the choice as two
        (("relu", "add", "sigmoid"), [["n0"], ["n1"]], ["priority fast", "host alone"]),
        # sigmoid, on the host, between them: "priority fast" builds what the choice builds
        (("relu", "sigmoid", "add"), [["n0"], ["n2"]], ["host alone"]),
    ],
)
def test_a_starting_point_placing_alike_is_a_contender_where_it_merges_neighbours(
    isolated, ops, matches, contenders
):
    cheap = {"fast.relu": 1e-9, "fast.add": 1e-9}  # every match on "fast", by cost and by order
    auto = _hub(_plugin(cheap)).explain(chain(ops=ops), placement="auto").auto
    assert [g["nodes"] for g in auto["groups"] if g["chosen"]] == matches
    assert auto["contenders"] == contenders


def test_auto_finalists_limits_the_contenders_and_zero_trusts_the_estimate(isolated):
    mod = chain(ops=RELU_ADD)
    one = _two(**{"auto-finalists": 1}).compile(mod, placement="auto").report.auto
    assert one["finalists"]["contenders"] == one["contenders"][:1]
    assert sorted(one["finalists"]["measured_ms"]) == sorted(["auto", one["contenders"][0]])
    none = _two(**{"auto-finalists": 0}).compile(mod, placement="auto").report.auto
    assert none["finalists"] == {"skipped": "auto-finalists = 0: the estimate decides"}
    with pytest.raises(ConfigError, match="auto-finalists: expected a whole number >= 0, got"):
        _two(**{"auto-finalists": -1})


class _Model:
    """A built model for the knockout's plumbing: ``run`` fails when told to."""

    def __init__(self, fails=False):
        self.fails = fails

    def run(self, *xs):
        if self.fails:
            raise RuntimeError("device lost\nmore")

    def warm_up(self, *xs):
        self.run(*xs)


def _comp(contenders, baselines, estimate=1.0, limit=6):
    from umahub.auto.choose import AutoChoice

    auto = AutoChoice(chosen={}, estimate=estimate, baselines=baselines, configured="x")
    auto.contenders = contenders
    config = SimpleNamespace(auto_finalists=limit)
    return SimpleNamespace(
        auto=auto, hub=SimpleNamespace(config=config), mod=chain(ops=("relu",)),
        pins={}, foreign=False, board=None,
    )  # fmt: skip


def test_a_match_goes_by_the_rounds_each_model_won_not_by_the_best_time(monkeypatch):
    from umahub.auto import finalists

    # a's best round (1.0) is the quickest, but b is faster in six rounds of seven:
    # a load that came and went in the first round favoured a alone
    a, b = _Model(), _Model()
    times = {id(a): iter([1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]),
             id(b): iter([1.0, 1.5, 1.8, 1.8, 1.8, 1.8, 1.8, 1.8])}  # fmt: skip
    order = []

    def median_run(model, xs, runs):
        order.append("a" if model is a else "b")
        return next(times[id(model)])

    monkeypatch.setattr(finalists, "_median_run", median_run)
    best_a, best_b, ratios = finalists._match(a, b, [])
    assert (best_a, best_b) == (1.0, 1.5)
    assert ratios == pytest.approx([1.5] + [0.9] * 6)  # 1.8 / 2.0 in six rounds
    assert statistics.median(ratios) == pytest.approx(0.9)  # what the match goes by
    # after the probe of each, the first to run in a round alternates
    assert "".join(order) == "ab" + "ab" + "ba" + "ab" + "ba" + "ab" + "ba" + "ab"


def test_the_chance_of_rounds_this_slow_is_the_share_of_sign_flips_reaching_them():
    from umahub.auto.finalists import slower_by_chance

    assert slower_by_chance([1.1] * 5) == 1 / 32
    # the one faster round is the smallest: flipping it, or nothing, reaches the sum
    assert slower_by_chance([1.1, 1.1, 1.1, 1.1, 0.95]) == 2 / 32
    assert slower_by_chance([1.1] * 4) == 1 / 16  # four rounds cannot show it
    assert slower_by_chance([0.9] * 5) == 1.0
    # beyond 16 rounds, drawn: a long run of rounds that all go one way is still shown
    assert slower_by_chance([1.02] * 40) < 0.001
    assert 0.3 < slower_by_chance([1.02, 0.98] * 20) <= 1.0


@pytest.mark.parametrize(
    ("ratios", "kept", "tie"),
    [
        ([1.03] * 7, "auto", False),  # the choice faster in every round: it stays
        ([1.03] * 6 + [0.97], "b alone", True),  # a round the other way: a tie, b takes it
        ([1.03, 1.03, 1.03, 0.99], "auto", False),  # four rounds cannot show it: the median
        ([0.98] * 7, "b alone", False),  # b faster: it takes the lead
    ],
)
def test_the_choice_keeps_the_lead_only_where_the_rounds_show_it_faster(
    isolated, monkeypatch, ratios, kept, tie
):
    from umahub.auto import finalists

    comp = _comp(["b alone"], {"b alone": 1})
    monkeypatch.setattr(finalists, "_match", lambda a, b, xs: (0.002, 0.002, ratios))
    build = lambda name: SimpleNamespace(compiled=_Model(), name=name)  # noqa: E731
    assert finalists.measure(comp, _Model(), build, lambda m: [], CostCache())[0] == kept
    assert comp.auto.finalists["tie"] is tie
    (line,) = _finalists_text(comp.auto.finalists)
    assert line.endswith(
        f"{'the choice' if kept == 'auto' else kept} is kept"
        + (" (a tie with the choice, which the rounds did not show faster)" if tie else "")
    )


def _finalists_text(verdict):
    from umahub.report.text import _finalists

    return _finalists({"finalists": verdict})


def test_a_tie_between_two_starting_points_keeps_the_leader(isolated, monkeypatch):
    from umahub.auto import finalists

    comp = _comp(["a alone", "b alone"], {"a alone": 1, "b alone": 1})
    results = iter([(0.002, 0.001, [0.5] * 7), (0.001, 0.001, [1.01] * 6 + [0.9])])
    monkeypatch.setattr(finalists, "_match", lambda a, b, xs: next(results))
    build = lambda name: SimpleNamespace(compiled=_Model(), name=name)  # noqa: E731
    assert finalists.measure(comp, _Model(), build, lambda m: [], CostCache())[0] == "a alone"
    assert comp.auto.finalists["tie"] is False


def test_a_contender_that_fails_to_build_or_run_is_left_out(isolated, monkeypatch):
    from umahub.auto import finalists

    comp = _comp(["a alone", "b alone", "c alone"], {"a alone": 1, "b alone": 1, "c alone": 1})
    monkeypatch.setattr(
        finalists, "_match", lambda a, b, xs: (0.002, 0.001, [0.5]) if not b.fails else b.run()
    )

    def build(name):
        if name == "a alone":
            raise ValueError("no kernel for conv2d")
        return SimpleNamespace(compiled=_Model(fails=name == "b alone"), name=name)

    kept, built = finalists.measure(comp, _Model(), build, lambda m: [], CostCache())
    assert kept == "c alone" and built.name == "c alone"
    assert comp.auto.finalists == {
        "contenders": ["a alone", "b alone", "c alone"],
        "measured_ms": {"auto": 2.0, "c alone": 1.0},
        "kept": "c alone",
        "tie": False,
        "left_out": {
            "a alone": "ValueError: no kernel for conv2d",
            "b alone": "RuntimeError: device lost",
        },
        "cached": False,
    }
    with pytest.raises(RuntimeError, match="device lost"):  # the choice cannot run: no verdict
        finalists.measure(comp, _Model(fails=True), build, lambda m: [], CostCache())


def test_contenders_are_built_while_the_estimates_known_error_could_make_them_win():
    from umahub.auto import finalists

    # within 40% either way: a contender estimated 1.4 / 0.6 = 2.333x slower can still win
    assert finalists.ERROR == 0.4 and finalists.WITHIN == pytest.approx(1.4 / 0.6)
    comp = _comp(["a alone", "b alone"], {"a alone": 2.33, "b alone": 2.34})
    assert finalists.contenders(comp) == ["a alone"]
    assert finalists.skipped(comp) == ""
    far = _comp(["b alone"], {"b alone": 2.34})
    assert finalists.skipped(far) == (
        "every other starting point is estimated more than 2.33x slower, more than the "
        "estimate's known error (40% either way) can make up (the nearest, b alone, 2.34x)"
    )
    assert finalists.contenders(
        _comp(["a alone", "b alone"], {"a alone": 1, "b alone": 1}, limit=1)
    ) == ["a alone"]


def test_the_choice_is_not_measured_against_a_plugins_cost_model_or_pins(isolated):
    mod = chain(ops=RELU_ADD)
    hub = _hub(_plugin({"fast.relu": 10.0, "fast.add": 1e-9}))
    report = hub.compile(mod, placement="auto").report
    assert report.auto["finalists"] == {
        "skipped": "costs come from a plugin's umahub_cost, which timing here would overrule"
    }
    assert (
        "  not measured against the other starting points: costs come from a plugin's "
        "umahub_cost, which timing here would overrule"
    ) in str(report).splitlines()
    measured = _hub(_plugin(None), placement={"n0": "host"})
    assert measured.compile(mod, placement="auto").report.auto["finalists"] == {
        "skipped": "operators are pinned (the claiming orders would ignore the pins)"
    }


def test_measured_costs_are_kept_apart_per_cpu(monkeypatch):
    # a home directory shared by an Intel and an AMD machine: each measures its own
    from types import SimpleNamespace

    from umahub.auto import costs as auto_costs
    from umahub.targets import host_target

    hub = SimpleNamespace(plugins=[], accelerators=[], options_of=lambda name: {})
    comp = SimpleNamespace(hub=hub, board=None, foreign=False, target=None)
    here = auto_costs.Costs(comp, build=None).base
    assert f"{host_target().get('mcpu', 'generic')} " in here[-1]
    monkeypatch.setattr(auto_costs, "_this_cpu", lambda: "testcpu An Imaginary CPU")
    there = auto_costs.Costs(comp, build=None).base
    assert there[-1].endswith("threads, testcpu An Imaginary CPU") and here != there


def _hardswish_model():
    """x -> relu (named "stem") -> hardswish as PyTorch's import names it: an add, a clip,
    a multiply and a divide, all named "act" (the source module's name)."""
    from tvm import relax

    from umahub._tvm import TensorType
    from umahub.ir import name_span

    bb = relax.BlockBuilder()
    x = relax.Var("x", TensorType((1, 8, 16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():

            def named(call, name):
                return bb.emit(relax.Call(call.op, call.args, call.attrs, span=name_span(name)))

            y = named(relax.op.nn.relu(x), "stem")
            a = named(relax.op.add(y, relax.const(3.0, "float32")), "act")
            c = named(relax.op.clip(a, 0.0, 6.0), "act")
            m = named(relax.op.multiply(y, c), "act")
            out = bb.emit_output(named(relax.op.divide(m, relax.const(6.0, "float32")), "act"))
        bb.emit_func_output(out)
    return bb.get()


def test_operators_of_one_name_are_one_node_of_the_choice():
    # placement places by name: the four operators of "act" were four nodes, each costed
    # and copied as the whole (mobilenet_v3_small was estimated 5x slower than it ran)
    from umahub.auto.candidates import Group
    from umahub.auto.choose import _host_seconds, _operators

    ops, outputs = _operators(_hardswish_model())
    assert [(o.name, o.op, o.inputs) for o in ops] == [
        ("stem", "relax.nn.relu", ()),
        ("act", "relax.divide", ("stem",)),
    ]
    elements = 8 * 16 * 16
    assert ops[1].flops == 4 * elements and ops[1].bytes == 4 * elements
    assert outputs == {"act"}
    nodes = ("stem", "act", "act", "act", "act")
    group = Group("npu", nodes, (), (), None, key="k", host_key="h")
    host = _host_seconds(ops, [(group, 5e-6)])
    assert host == pytest.approx({"stem": 1e-6, "act": 4e-6})


def test_operators_named_only_by_one_variable_name_are_nodes_apart():
    # passes before placement name the bindings they add "lv", "lv1", ... again: on
    # efficientnet_b0 six names each held an add and an unrelated convolution, costed and
    # placed as one (a 1x1 convolution of 21.7 MFLOPs was estimated at 2 microseconds)
    import tvm
    from tvm import relax

    from umahub._tvm import TensorType
    from umahub.auto.choose import _operators

    t = TensorType((1, 8, 4, 4), "float32")
    x = relax.Var("x", t)
    a, b, c = relax.DataflowVar("lv", t), relax.DataflowVar("lv", t), relax.Var("out", t)
    block = relax.DataflowBlock(
        [
            relax.VarBinding(a, relax.op.nn.relu(x)),
            relax.VarBinding(b, relax.op.add(a, x)),
            relax.VarBinding(c, relax.op.multiply(b, a)),
        ]
    )
    main = relax.Function([x], relax.SeqExpr([block], c), t).with_attr("global_symbol", "main")
    ops, outputs = _operators(tvm.IRModule({"main": main}))
    assert [(o.name, o.op, o.inputs) for o in ops] == [
        ("lv", "relax.nn.relu", ()),
        ("lv.1", "relax.add", ("lv",)),
        ("out", "relax.multiply", ("lv.1", "lv")),
    ]
    assert outputs == {"out"}


def test_a_cores_private_caches_are_the_largest_it_does_not_share(tmp_path):
    from umahub.auto.costs import private_cache_bytes

    for index, (size, shared) in enumerate(
        [("48K", "0"), ("32K", "0"), ("2048K", "0"), ("307200K", "0-1")]
    ):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
        (tmp_path / f"index{index}" / "shared_cpu_list").write_text(f"{shared}\n")
    assert private_cache_bytes(str(tmp_path)) == 2 << 20
    assert private_cache_bytes(str(tmp_path / "none")) == 2 << 20  # sysfs says nothing
    (tmp_path / "index2" / "size").write_text("1M\n")
    assert private_cache_bytes(str(tmp_path)) == 1 << 20


def test_every_timed_run_of_a_group_starts_with_its_cores_caches_written_over(monkeypatch):
    # alone, a group run again and again finds its weights in its core's cache; in the
    # model the rest of the model ran in between
    from umahub.auto import costs as auto_costs

    evicted = []
    monkeypatch.setattr(auto_costs, "evict_caches", lambda: evicted.append(1))
    monkeypatch.setattr(auto_costs, "_more_runs", lambda times: 0)
    hub = _hub(_plugin(None), **{"auto-finalists": 0})
    auto = hub.compile(chain(ops=("relu",)), placement="auto").report.auto
    assert auto["costs"] == {"plugin": 0, "measured": 2, "cached": 0, "none": 0}
    assert len(evicted) == 2 * auto_costs.RUNS  # on the accelerator and on the host


def test_before_each_runs_before_every_timed_inference_and_is_not_timed():
    from umahub.runtime.compiled import example_inputs

    compiled = umahub.Hub(autoload=False, project_config=False).compile(chain(ops=("relu",)))
    arrays = example_inputs(compiled.input_info)
    calls = []
    steps = compiled._executors.step_seconds(arrays, 3, lambda: calls.append("step"))
    seconds, _ = compiled._executors.call_seconds(arrays, 4, lambda: calls.append("call"))
    assert calls == ["step"] * 3 + ["call"] * 4
    assert len(steps["main"]) == 3
