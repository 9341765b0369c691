"""How ``executor = "auto"`` chooses, and changes its mind: :mod:`umahub.runtime.choosing`,
on made-up call times (the choice's rule, not this machine's speed)."""

from __future__ import annotations

from umahub.runtime.choosing import (
    AUTO_BLOCK,
    AUTO_RECHECK,
    AUTO_SWITCH,
    AUTO_TRIAL_CALLS,
    AUTO_TRIALS,
    ExecutorChoice,
    compare,
)

#: A cold first call of a block: 50x its steady time (threads waking up on a busy machine).
COLD = 50


def _trials(choice: ExecutorChoice, vm: float, concurrent: float) -> None:
    """Run the trials: blocks of AUTO_BLOCK calls, VM first, each block's first call cold."""
    for _ in range(AUTO_TRIALS):
        for which, seconds in (("vm", vm), ("concurrent", concurrent)):
            for k in range(AUTO_BLOCK):
                assert choice.next() == which
                choice.record(which, seconds * (COLD if k == 0 else 1))


def test_concurrent_is_kept_only_when_clearly_faster_in_most_pairs():
    assert compare([0.010] * 4, [0.008] * 4) == (
        "concurrent",
        "concurrent 8 ms against the VM's 10 ms (medians of 4 and 4), faster in 4 of 4 pairs",
    )
    # 3% faster: within the margin, the VM stays
    assert compare([0.010] * 4, [0.0097] * 4) == (
        "vm",
        "concurrent 9.7 ms against the VM's 10 ms (medians of 4 and 4), faster in 4 of 4 pairs: "
        "not 5% faster in most",
    )
    # a median 8% lower, but slower than the VM block next to it in 3 pairs of 5 (the
    # machine's load changed during the trials): the VM stays
    vm = [0.008, 0.008, 0.012, 0.012, 0.012]
    concurrent = [0.009, 0.009, 0.011, 0.0115, 0.0125]
    assert compare(vm, concurrent) == (
        "vm",
        "concurrent 11 ms against the VM's 12 ms (medians of 5 and 5), faster in 2 of 5 pairs: "
        "not 5% faster in most",
    )


def test_auto_times_blocks_without_their_cold_first_call_then_runs_the_choice():
    choice = ExecutorChoice()
    assert (
        choice.progress() == f"timing both executors: 0 of {2 * AUTO_TRIALS} blocks of calls timed"
    )
    # the cold first calls would make the VM look 50x slower than it is: not timed
    _trials(choice, vm=0.010, concurrent=0.012)
    assert choice.chosen == "vm"
    assert choice.why == (
        f"timed on the first calls, in blocks of {AUTO_BLOCK}: concurrent 12 ms against the "
        f"VM's 10 ms (medians of {AUTO_TRIALS} and {AUTO_TRIALS}), faster in 0 of "
        f"{AUTO_TRIALS} pairs: not 5% faster in most"
    )
    # then the choice, and a block on the other executor to check it
    assert [choice.next() for _ in range(AUTO_RECHECK + AUTO_BLOCK - 1)] == ["vm"] * (
        AUTO_RECHECK - 1
    ) + ["concurrent"] * AUTO_BLOCK


def _run(choice: ExecutorChoice, calls: int, seconds: dict[str, float]) -> list[int]:
    """``calls`` more calls taking ``seconds[executor]`` (cold first calls of a check
    block); the numbers of the calls (from the choice) that began a check."""
    checks, previous = [], choice.chosen
    for call in range(1, calls + 1):
        which = choice.next()
        starts = which != choice.chosen and (not checks or checks[-1] + AUTO_BLOCK <= call)
        if starts:
            checks.append(call)
        choice.record(which, seconds[which] * (COLD if starts else 1))
        if choice.chosen != previous:
            break
    return checks


def test_checks_an_executor_that_keeps_losing_less_and_less_often():
    choice = ExecutorChoice()
    _trials(choice, vm=0.010, concurrent=0.001)
    assert choice.chosen == "concurrent"
    checks = _run(choice, 500, {"vm": 0.010, "concurrent": 0.001})
    assert choice.chosen == "concurrent"
    r = AUTO_RECHECK
    # the next check waits twice as long after each lost one, counted from the block's end
    assert checks == [r, 3 * r + 2, 7 * r + 4, 15 * r + 6]


def test_auto_switches_when_the_other_executor_wins_check_after_check():
    # chosen on a quiet machine; then a neighbour makes the concurrent executor slow
    choice = ExecutorChoice()
    _trials(choice, vm=0.010, concurrent=0.006)
    assert choice.chosen == "concurrent"
    checks = _run(choice, 500, {"vm": 0.011, "concurrent": 0.030})
    assert choice.chosen == "vm"
    assert len(checks) == AUTO_SWITCH
    switched = AUTO_TRIAL_CALLS + checks[-1] + AUTO_BLOCK - 1
    assert choice.why == (
        f"switched at call {switched}: the VM took 11 ms in {AUTO_SWITCH} checks in a row "
        "against 30 ms for the concurrent executor (the median of its last 9 calls)"
    )


def test_one_check_lost_does_not_switch():
    choice = ExecutorChoice()
    _trials(choice, vm=0.010, concurrent=0.006)
    # 0.009: not 5% under the concurrent executor's 6 ms: that check ends the run of wins
    for vm_seconds in [0.003] * (AUTO_SWITCH - 1) + [0.009] + [0.003] * (AUTO_SWITCH - 1):
        checked = 0
        while checked < AUTO_BLOCK:  # up to the end of the next check's block
            which = choice.next()
            checked += which == "vm"
            choice.record(which, vm_seconds if which == "vm" else 0.006)
        assert choice.chosen == "concurrent"
