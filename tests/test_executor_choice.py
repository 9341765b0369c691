"""How ``executor = "auto"`` chooses, and changes its mind: :mod:`umahub.runtime.choosing`,
on made-up call times (the choice's rule, not this machine's speed)."""

from __future__ import annotations

from umahub.runtime.choosing import (
    AUTO_RECHECK,
    AUTO_SWITCH,
    AUTO_TRIALS,
    ExecutorChoice,
    compare,
)


def _trials(choice: ExecutorChoice, vm: list[float], concurrent: list[float]) -> None:
    """Run the trials: warm-up calls of 1 s, then the given times, alternating."""
    for v, c in zip([1.0, *vm], [1.0, *concurrent]):
        assert choice.next() == "vm"
        choice.record("vm", v)
        assert choice.next() == "concurrent"
        choice.record("concurrent", c)


def test_concurrent_is_kept_only_when_clearly_faster_in_most_pairs():
    assert compare([0.010] * 5, [0.008] * 5) == (
        "concurrent",
        "concurrent 8 ms against the VM's 10 ms (medians of 5 and 5 calls), "
        "faster in 5 of 5 pairs of calls",
    )
    # 3% faster: within the margin, the VM stays
    assert compare([0.010] * 5, [0.0097] * 5) == (
        "vm",
        "concurrent 9.7 ms against the VM's 10 ms (medians of 5 and 5 calls), "
        "faster in 5 of 5 pairs of calls: not 5% faster in most",
    )
    # a median 8% lower, but slower than the VM call next to it in 3 pairs of 5 (the
    # machine's load changed during the trials): the VM stays
    vm = [0.008, 0.008, 0.012, 0.012, 0.012]
    concurrent = [0.009, 0.009, 0.011, 0.0115, 0.0125]
    assert compare(vm, concurrent) == (
        "vm",
        "concurrent 11 ms against the VM's 12 ms (medians of 5 and 5 calls), "
        "faster in 2 of 5 pairs of calls: not 5% faster in most",
    )


def test_auto_chooses_after_its_trials_and_then_runs_the_choice():
    choice = ExecutorChoice()
    assert choice.progress() == f"timing both executors: 0 of {2 * AUTO_TRIALS} calls timed"
    _trials(choice, [0.010] * AUTO_TRIALS, [0.006] * AUTO_TRIALS)
    assert choice.chosen == "concurrent"
    assert choice.why.startswith("timed on the first calls: concurrent 6 ms against the VM's 10 ms")
    assert [choice.next() for _ in range(AUTO_RECHECK - 2 * (AUTO_TRIALS + 1) - 1)] == [
        "concurrent"
    ] * (AUTO_RECHECK - 2 * (AUTO_TRIALS + 1) - 1)


def _until_check(choice: ExecutorChoice, seconds: float) -> str:
    """Calls on the chosen executor, each taking ``seconds``, up to the next check; its
    executor."""
    while True:
        which = choice.next()
        if which != choice.chosen:
            return which
        choice.record(which, seconds)


def test_auto_switches_when_the_other_executor_wins_check_after_check():
    # chosen on a quiet machine; then a neighbour makes the concurrent executor slow
    choice = ExecutorChoice()
    _trials(choice, [0.010] * AUTO_TRIALS, [0.006] * AUTO_TRIALS)
    for _ in range(AUTO_SWITCH):
        assert choice.chosen == "concurrent"
        assert _until_check(choice, 0.030) == "vm"
        choice.record("vm", 0.011)
    assert choice.chosen == "vm"
    assert choice.why == (
        f"switched at call {AUTO_SWITCH * AUTO_RECHECK}: the VM took 11 ms in {AUTO_SWITCH} "
        "checks in a row against 30 ms for the concurrent executor (the median of its last 9 "
        "calls)"
    )


def test_one_check_lost_does_not_switch():
    choice = ExecutorChoice()
    _trials(choice, [0.010] * AUTO_TRIALS, [0.006] * AUTO_TRIALS)
    for vm_seconds in [0.003] * (AUTO_SWITCH - 1) + [0.009] + [0.003] * (AUTO_SWITCH - 1):
        assert _until_check(choice, 0.006) == "vm"
        choice.record("vm", vm_seconds)  # 0.009: not 5% under 6 ms: the run of wins ends
    assert choice.chosen == "concurrent"
