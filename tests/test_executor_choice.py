"""How ``executor = "auto"`` chooses, and changes its mind: :mod:`umahub.runtime.choosing`,
on made-up call times (the choice's rule, not this machine's speed)."""

from __future__ import annotations

import itertools

from umahub.runtime.choosing import (
    AUTO_BLOCK,
    AUTO_CHANGE,
    AUTO_CONFIRM,
    AUTO_PERSIST,
    AUTO_RECHECK,
    AUTO_SWITCH,
    AUTO_TRIALS,
    AUTO_WATCH,
    ExecutorChoice,
    choose,
    compare,
)

#: A cold first call of a block: 50x its steady time (threads waking up on a busy machine).
COLD = 50
#: The ways of a model on two devices, with a TVM pool of two threads.
THREE = {
    "vm": "the VM on 2 threads",
    "vm1": "the VM on one thread",
    "concurrent": "the concurrent executor",
}
#: The ways of a model on one device, with a TVM pool of two threads.
VM_TWO_AND_ONE = {"vm": "the VM on 2 threads", "vm1": "the VM on one thread"}


def _trials(choice: ExecutorChoice, **seconds: float) -> None:
    """Run the trials: blocks of AUTO_BLOCK calls, the ways in turn, each block's first call
    cold; ``seconds`` of each way."""
    for _ in range(AUTO_TRIALS):
        for which in choice.ways:
            for k in range(AUTO_BLOCK):
                assert choice.next() == which
                choice.record(which, seconds[which] * (COLD if k == 0 else 1))


def test_concurrent_is_kept_only_when_clearly_faster_in_most_pairs():
    assert compare([0.010] * 4, [0.008] * 4) == (
        "concurrent",
        "the concurrent executor 8 ms against 10 ms for the VM (medians of 4 and 4), faster in "
        "4 of 4 rounds",
    )
    # 3% faster: within the margin, the VM stays
    assert compare([0.010] * 4, [0.0097] * 4) == (
        "vm",
        "the concurrent executor 9.7 ms against 10 ms for the VM (medians of 4 and 4), faster in "
        "4 of 4 rounds: not 5% faster in most",
    )
    # a median 8% lower, but slower than the VM block next to it in 3 pairs of 5 (the
    # machine's load changed during the trials): the VM stays
    vm = [0.008, 0.008, 0.012, 0.012, 0.012]
    concurrent = [0.009, 0.009, 0.011, 0.0115, 0.0125]
    assert compare(vm, concurrent) == (
        "vm",
        "the concurrent executor 11 ms against 12 ms for the VM (medians of 5 and 5), faster in "
        "2 of 5 rounds: not 5% faster in most",
    )


def test_auto_times_blocks_without_their_cold_first_call_then_runs_the_choice():
    choice = ExecutorChoice()
    assert choice.progress() == f"timing 2 ways: 0 of {2 * AUTO_TRIALS} blocks of calls timed"
    # the cold first calls would make the VM look 50x slower than it is: not timed
    _trials(choice, vm=0.010, concurrent=0.012)
    assert choice.chosen == "vm"
    assert choice.why == (
        f"timed on the first calls, in blocks of {AUTO_BLOCK}: the concurrent executor 12 ms "
        f"against 10 ms for the VM (medians of {AUTO_TRIALS} and {AUTO_TRIALS}), faster in 0 of "
        f"{AUTO_TRIALS} rounds: not 5% faster in most"
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
    # the VM chosen, then the concurrent executor gets faster while the VM's own time holds
    choice = ExecutorChoice()
    _trials(choice, vm=0.010, concurrent=0.012)
    assert choice.chosen == "vm"
    checks = _run(choice, 500, {"vm": 0.011, "concurrent": 0.006})
    assert choice.chosen == "concurrent"
    assert len(checks) == AUTO_SWITCH
    switched = 2 * AUTO_TRIALS * AUTO_BLOCK + checks[-1] + AUTO_BLOCK - 1
    assert choice.why == (
        f"switched at call {switched}: the concurrent executor took 6 ms in {AUTO_SWITCH} checks "
        "in a row against 11 ms for the VM (the median of its last 10 calls)"
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


def test_three_ways_the_vm_on_one_thread_kept_when_clearly_faster():
    trials = {"vm": [0.030] * 4, "vm1": [0.010] * 4, "concurrent": [0.012] * 4}
    assert choose(trials, THREE) == (
        "vm1",
        "the VM on one thread 10 ms against 30 ms for the VM on 2 threads (medians of 4 and 4), "
        "faster in 4 of 4 rounds; the concurrent executor 12 ms against 30 ms for the VM on 2 "
        "threads (medians of 4 and 4), faster in 4 of 4 rounds",
    )
    # both clearly faster than the first: the lower median
    trials["concurrent"] = [0.008] * 4
    assert choose(trials, THREE)[0] == "concurrent"
    # neither: the first
    assert choose({"vm": [0.01] * 4, "vm1": [0.02] * 4, "concurrent": [0.0098] * 4}, THREE)[0] == (
        "vm"
    )


def test_three_ways_take_turns_in_the_trials_and_each_has_its_own_wait_between_checks():
    choice = ExecutorChoice(THREE)
    assert choice.trial_calls == 3 * AUTO_TRIALS * AUTO_BLOCK
    assert choice.progress() == f"timing 3 ways: 0 of {3 * AUTO_TRIALS} blocks of calls timed"
    _trials(choice, vm=0.010, vm1=0.020, concurrent=0.030)  # asserts the turns
    assert choice.chosen == "vm"
    # both others lose every check by far: the first in the ways' order checked
    # AUTO_RECHECK calls after the choice, the other AUTO_RECHECK calls after that (one
    # slower block at a time); then each waits twice as long as before, counted from
    # the end of its own block
    checks = _run(choice, 300, {"vm": 0.010, "vm1": 0.020, "concurrent": 0.030})
    r, b = AUTO_RECHECK, AUTO_BLOCK
    vm1 = [r, 3 * r + b - 1, 7 * r + 2 * b - 2]
    concurrent = [2 * r, 4 * r + b - 1, 8 * r + 2 * b - 2]
    assert checks == sorted(vm1 + concurrent)
    assert choice.chosen == "vm"


def test_a_way_that_keeps_losing_does_not_hold_back_one_that_wins():
    """The one thread chosen from the first calls, where the VM on two threads ran slow;
    when the machine changes, both others are checked at once: the VM on two threads
    wins, and its next checks come AUTO_CONFIRM calls apart, whatever the concurrent
    executor's check lost between them (one wait for all: each of its wins was undone
    by the concurrent executor's loss, 170 calls to switch on a real model)."""
    choice = ExecutorChoice(THREE)
    _trials(choice, vm=0.030, vm1=0.020, concurrent=0.050)
    assert choice.chosen == "vm1"
    checks = _run(choice, 300, {"vm": 0.014, "vm1": 0.032, "concurrent": 0.050})
    w, b, c = AUTO_WATCH * AUTO_PERSIST, AUTO_BLOCK, AUTO_CONFIRM
    # 32 ms: the one thread 1.6x its usual 20 ms, two runs of calls in a row; then vm's
    # check, the concurrent executor's right after it (lost by far), and vm's next
    # ones AUTO_CONFIRM calls after each of its won ones ended
    assert checks == [w + 1, w + 1 + b, w + b + c, w + 2 * b + 2 * c - 1][: 1 + AUTO_SWITCH]
    assert choice.chosen == "vm"
    assert choice.why.startswith(
        f"switched at call {3 * AUTO_TRIALS * b + checks[-1] + b - 1}: the VM on 2 threads "
        f"took 14 ms in {AUTO_SWITCH} checks in a row against 32 ms for the VM on one thread"
    )


def test_a_check_lost_by_less_than_the_margin_keeps_the_way_checked_as_often():
    """A way about as fast as the chosen one costs nothing to check: its wait does not
    grow, so that it is checked often while it might be getting faster (the VM on two
    threads for the first hundred calls of a process)."""
    choice = ExecutorChoice(VM_TWO_AND_ONE)
    _trials(choice, vm=0.030, vm1=0.020)
    assert choice.chosen == "vm1"
    # 2% slower than the chosen way: lost, but within the margin
    checks = _run(choice, 200, {"vm": 0.0204, "vm1": 0.020})
    r, b = AUTO_RECHECK, AUTO_BLOCK
    assert checks[:4] == [r, 2 * r + b - 1, 3 * r + 2 * b - 2, 4 * r + 3 * b - 3]
    # 20% slower: each check doubles the wait
    checks = _run(choice, 200, {"vm": 0.024, "vm1": 0.020})
    gaps = [later - start for start, later in itertools.pairwise(checks)]
    assert gaps == [2 * r + b - 1, 4 * r + b - 1]
    assert choice.chosen == "vm1"


def _steady(choice: ExecutorChoice, calls: int, seconds: float) -> None:
    """``calls`` calls on the chosen way, each ``seconds``, none of them a check of
    another way."""
    for _ in range(calls):
        which = choice.next()
        assert which == choice.chosen
        choice.record(which, seconds)


def test_a_busy_machine_has_auto_check_every_other_way_within_a_few_calls():
    # chosen on a quiet machine: the VM on both threads
    choice = ExecutorChoice(THREE)
    _trials(choice, vm=0.010, vm1=0.018, concurrent=0.020)
    assert choice.chosen == "vm"
    chose = choice.why
    # a neighbour starts: the VM's own calls take 2.5 times as long; its checks of the
    # others would come 20 calls later, but the change shows within two runs of
    # AUTO_WATCH, and both others are checked at once
    w, b, c = AUTO_WATCH * AUTO_PERSIST, AUTO_BLOCK, AUTO_CONFIRM
    assert w < AUTO_RECHECK
    busy = {"vm": 0.025, "vm1": 0.012, "concurrent": 0.040}
    checks = _run(choice, 2 * AUTO_RECHECK, busy)
    assert choice.why.startswith(
        f"switched at call {3 * AUTO_TRIALS * b + checks[-1] + b - 1}: the VM on one thread "
        f"took 12 ms in {AUTO_SWITCH} checks in a row against 25 ms for the VM on 2 threads"
    )
    assert checks == [w + 1, w + 1 + b, w + b + c, w + 2 * b + 2 * c - 1]
    assert choice.chosen == "vm1"
    # the one thread runs as checked for a while, 2 * AUTO_RECHECK calls of its own
    # (the others lose their checks by far, the first AUTO_RECHECK calls after the
    # switch, the other AUTO_RECHECK after it) ...
    r = AUTO_RECHECK
    assert _run(choice, 2 * r + 2 * b, busy) == [r, 2 * r]
    assert choice.chosen == "vm1"
    # ... then the neighbour stops: the one thread's calls drop under its usual 12 ms by
    # more than AUTO_CHANGE, and the VM on two threads, checked at once, wins again
    quiet = {"vm": 0.004, "vm1": 0.007, "concurrent": 0.009}
    checks = _run(choice, 2 * AUTO_RECHECK, quiet)
    assert checks == [w + 1, w + 1 + b, w + b + c, w + 2 * b + 2 * c - 1]
    assert choice.chosen == "vm"
    assert choice.why.startswith("switched at call ")
    assert chose.startswith("timed on the first calls")


def test_a_change_of_the_machine_costs_one_block_on_a_way_that_lost_by_far():
    """The benchmark's case (the Intel Xeon, int8 resnet18 with TVM_NUM_THREADS set):
    the VM and the concurrent executor, the second 2x slower; a run of slower VM calls
    (4.4 against 2.6 ms) once timed both again, 12 calls on the concurrent executor
    at twice the time. Now it is checked once, loses, and waits twice as long."""
    choice = ExecutorChoice()
    _trials(choice, vm=0.0026, concurrent=0.0062)
    chose = choice.why
    w, b, r = AUTO_WATCH * AUTO_PERSIST, AUTO_BLOCK, AUTO_RECHECK
    checks = _run(choice, 6 * r, {"vm": 0.0044, "concurrent": 0.0090})
    assert choice.chosen == "vm"
    assert checks == [w + 1, w + b + 2 * r]  # at once, then after twice the wait
    assert choice.why == (
        f"{chose}; at call {2 * AUTO_TRIALS * b + w}, the VM took 4.4 ms (the median of its "
        f"last {w} calls) against its usual 2.6 ms, slower by over 1.5x in each run of 5 of "
        "them: every other way checked at once"
    )


def test_a_way_faster_once_chosen_than_in_the_trials_is_not_checked_at_once():
    """The trials are a process's first calls, in blocks between other ways: the VM on
    two threads can run slower there (2.7 against 1.7 ms on a real model, a 2-core AMD
    EPYC), and its first calls once chosen, far faster than its trials, once read as the
    machine getting quiet: every way timed again, 36 calls more on the slower ways."""
    choice = ExecutorChoice(THREE)
    _trials(choice, vm=0.027, vm1=0.032, concurrent=0.040)
    assert choice.chosen == "vm"
    chose = choice.why
    # 17 ms: more than AUTO_CHANGE under its 27 ms in the trials, in every run of calls
    assert 0.017 * AUTO_CHANGE < 0.027
    _steady(choice, AUTO_RECHECK - 1, 0.017)
    assert (choice.chosen, choice.why) == ("vm", chose)
    # its usual time is now the 17 ms of those calls: a neighbour that doubles it shows
    busy = {"vm": 0.036, "vm1": 0.040, "concurrent": 0.050}
    _run(choice, 2 * AUTO_RECHECK, busy)
    assert choice.chosen == "vm"
    assert "against its usual 17 ms, slower by over 1.5x" in choice.why


def test_a_slowdown_that_does_not_last_keeps_the_choice_without_checks():
    choice = ExecutorChoice(THREE)
    _trials(choice, vm=0.010, vm1=0.018, concurrent=0.020)
    chose = choice.why
    # a run of slow calls (a neighbour's burst), a few more than one run of AUTO_WATCH,
    # then the usual time: not every run of the last calls was slow, so no checks
    calls = [0.025] * (AUTO_WATCH + 2) + [0.010] * (AUTO_RECHECK - AUTO_WATCH - 3)
    for seconds in calls:
        _steady(choice, 1, seconds)
        assert choice.chosen == "vm"
    assert choice.why == chose


def test_noise_within_the_change_factor_keeps_the_choice():
    choice = ExecutorChoice(THREE)
    _trials(choice, vm=0.010, vm1=0.018, concurrent=0.020)
    slower, faster = 0.010 * AUTO_CHANGE * 0.99, 0.010 / AUTO_CHANGE * 1.01
    # just inside the factor either way, and single outliers far outside it
    calls = [slower] * AUTO_WATCH + [faster] * AUTO_WATCH + [0.01, 0.03, 0.01, 0.01, 0.001, 0.01]
    assert len(calls) < AUTO_RECHECK  # no check of the others in between
    for seconds in calls:
        _steady(choice, 1, seconds)
        assert choice.chosen == "vm"


def test_one_way_is_chosen_at_once_with_its_reason():
    reason = "TVM_NUM_THREADS=1 is set: the VM keeps its thread pool"
    choice = ExecutorChoice({"vm": "the VM"}, reason)
    assert (choice.chosen, choice.why, choice.trial_calls) == ("vm", reason, 0)
    for _ in range(3 * AUTO_RECHECK):  # never a check, never timed again
        assert choice.next() == "vm"
        choice.record("vm", 0.5)
    assert choice.chosen == "vm"
    two = ExecutorChoice(TWO := {"vm": "the VM", "concurrent": "the concurrent executor"}, reason)
    _trials(two, vm=0.010, concurrent=0.012)
    assert two.ways == TWO
    assert two.why.endswith(f"not 5% faster in most ({reason})")


def test_calls_of_a_way_from_before_its_block_end_the_block_but_never_give_an_empty_way():
    """From several threads, a block can fill up with calls of its way handed out
    before it started (the previous block of that way): it ends early, and the
    calls it still had to give go to the next block. ``next`` once gave ``""``
    then, and recording that call raised KeyError('') (eight threads on one model)."""
    choice = ExecutorChoice(THREE)
    first = [choice.next() for _ in range(AUTO_BLOCK)]  # one block, in flight
    assert len(set(first)) == 1
    for _ in range(AUTO_BLOCK):  # ... and its calls come back
        choice.record(first[0], 0.01)
    second = choice.next()  # a block of another way starts
    for _ in range(AUTO_BLOCK):  # late calls of the second's way, from its earlier block
        choice.record(second, 0.02)
    given = [choice.next() for _ in range(3 * AUTO_BLOCK)]
    assert "" not in given
    for way in given:
        choice.record(way, 0.01)
