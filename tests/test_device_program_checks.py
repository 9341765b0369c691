"""What a device accelerator's codegen returns, checked: ``ProgramTiming`` when it is made
(each impossible timing a ValueError naming the field, a wrong type a TypeError), and the
program's metadata when umahub receives it (the key JSON cannot hold named)."""

from __future__ import annotations

import pytest

import umahub.plugin as up
from umahub.errors import PluginOutputError
from umahub.hub.contract import checked_device_program


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


@pytest.mark.parametrize(
    ("metadata", "where", "what"),
    [
        ({"format": 1, "made": {1, 2}}, "metadata['made']", "set {1, 2}"),
        ({"tiles": [1, 2, float("nan")]}, "metadata['tiles'][2]", "float nan"),
        ({"sizes": {(1, 2): 3}}, "metadata['sizes'] key", "tuple (1, 2)"),
    ],
)
def test_metadata_json_cannot_hold_is_named_by_its_key(metadata, where, what):
    with pytest.raises(PluginOutputError) as caught:
        checked_device_program(up.DeviceProgram(b"TNPU", metadata), "tinynpu")
    assert str(caught.value) == (
        f"umahub_codegen returned a DeviceProgram whose {where} is {what}, which JSON cannot "
        "hold: metadata takes str, int, float (finite), bool, None, and lists and dicts (str "
        "keys) of them"
    )
