"""``ProgramTiming``: a device program's cycles, checked when it is made, each impossible
timing refused with a ValueError naming the field (a wrong type stays a TypeError)."""

from __future__ import annotations

import pytest

import umahub.plugin as up


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cycles": -5}, "ProgramTiming.cycles must be >= 0, got -5"),
        (
            {"cycles": 10, "busy": {"load": 500}},
            "ProgramTiming.busy['load'] = 500 must be between 0 and the run's cycles (10): a "
            "module is busy at most the whole run",
        ),
        (
            {"cycles": 10, "busy": {"load": -1}},
            "ProgramTiming.busy['load'] = -1 must be between 0 and the run's cycles (10): a "
            "module is busy at most the whole run",
        ),
        (
            {"cycles": 10, "busy": {"load": 5}, "spans": [("load", 0, 20)]},
            "ProgramTiming.spans needs 0 <= start <= end <= cycles (10), got ('load', 0, 20)",
        ),
        (
            {"cycles": 10, "busy": {"load": 5}, "spans": [("load", 6, 2)]},
            "ProgramTiming.spans needs 0 <= start <= end <= cycles (10), got ('load', 6, 2)",
        ),
        (
            {"cycles": 10, "busy": {"load": 5}, "spans": [("load", 0, 5), ("dma2", 0, 2)]},
            "ProgramTiming.spans has a span of module 'dma2', which busy does not name (busy "
            "names 'load'): give its busy cycles too",
        ),
        (
            {"cycles": 10, "spans": [("load", 0, 5)]},
            "ProgramTiming.spans has a span of module 'load', which busy does not name (busy "
            "names nothing): give its busy cycles too",
        ),
    ],
)
def test_an_impossible_timing_is_a_value_error_naming_the_field(fields, message):
    with pytest.raises(ValueError) as caught:
        up.ProgramTiming(**fields)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cycles": 1.5}, "ProgramTiming.cycles must be an int, got 1.5"),
        ({"cycles": True}, "ProgramTiming.cycles must be an int, got True"),
        (
            {"cycles": 4, "busy": {"load": "2"}},
            "ProgramTiming.busy maps module names to ints, got 'load': '2'",
        ),
        (
            {"cycles": 4, "busy": {"load": 2}, "spans": ["load"]},
            "ProgramTiming.spans holds (module, start, end) cycles, got 'load'",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_a_type_error(fields, message):
    with pytest.raises(TypeError) as caught:
        up.ProgramTiming(**fields)
    assert str(caught.value) == message


def test_a_possible_timing_is_kept_as_given():
    timing = up.ProgramTiming(
        10, busy={"load": 4, "compute": 10}, spans=[["load", 0, 4], ("compute", 0, 10)]
    )
    assert timing.spans == (("load", 0, 4), ("compute", 0, 10))
    assert timing.serial_cycles == 14
    assert timing.to_dict() == {"cycles": 10, "busy": {"load": 4, "compute": 10}, "notes": []}
