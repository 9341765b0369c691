"""Messages say the real reason, in sizes people read.

A pin that an accelerator's pattern check refused quotes the check's reason
(``umahub.Refusal``); a check returning a bool still works and is reported
as giving no reason; every byte count a user reads is in B/KiB/MiB/GiB.
"""

from __future__ import annotations

import json

import pytest
from graphs import chain

import umahub
import umahub.models as zoo
from umahub.errors import PlacementError
from umahub.plugin.patterns import Refusal, refusal_reason
from umahub.sizes import human_size

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"], "on-error": "error"}


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (16 * 1024, "16 KiB"),
        (24 * 1024, "24 KiB"),
        (1000 * 1024, "1000 KiB"),
        (4_000_000, "3.8 MiB"),
        (1024**3, "1 GiB"),
        (1024**3 - 114 * 1024, "1 GiB"),  # 1023.9 MiB: not "1024 MiB"
        (1024 * 1024 - 1, "1 MiB"),
        (3 * 1024**4, "3 TiB"),
    ],
)
def test_human_size(n, text):
    assert human_size(n) == text


def test_a_refusal_is_false_and_carries_its_reason():
    refusal = Refusal("too big")
    assert not refusal
    assert (str(refusal), repr(refusal)) == ("too big", "Refusal('too big')")
    assert refusal == Refusal("too big") and refusal != Refusal("too small")
    assert umahub.Refusal is Refusal
    assert [refusal_reason(r) for r in (True, 1, refusal, False, None, 0)] == [
        None,
        None,
        "too big",
        "",
        "",
        "",
    ]


def _explain_error(placement):
    hub = umahub.Hub(config={**BUNDLED, "placement": placement}, project_config=False)
    with pytest.raises(PlacementError) as info:
        hub.explain(zoo.get("cnn"))
    return str(info.value)


def test_pin_refused_by_the_dsp_check_says_the_tcm_is_too_small():
    # The residual add reads two (1, 8, 16, 16) tensors and writes one: 24 KiB.
    assert _explain_error({"residual": "dsp_cpu"}) == (
        "pin 'residual' -> 'dsp_cpu': operator 'residual' (relax.add) runs on host, because "
        "pattern 'dsp_cpu.add' refused it: its tensors take 24 KiB, more than a quarter of "
        "the 64 KiB TCM (16 KiB); pin it elsewhere"
    )


def test_pin_refused_by_the_npu_check_names_the_channels_once_for_all_its_patterns():
    assert _explain_error({"conv1": "npu"}) == (
        "pin 'conv1' -> 'npu': operator 'conv1' (relax.nn.conv2d) runs on host, because "
        "patterns 'npu.conv2d_bias_act', 'npu.conv2d_bias', 'npu.conv2d' refused it: "
        "3 input channels, not a multiple of the npu's 8-wide array; pin it elsewhere"
    )


def test_a_pin_refused_warns_with_the_reason_under_fallback():
    hub = umahub.Hub(
        config={"plugins": ["npu", "dsp"], "placement": {"residual": "dsp_cpu:1"}},
        project_config=False,
    )
    with pytest.warns(umahub.UmahubWarning, match="more than a quarter of the 64 KiB TCM"):
        report = hub.explain(zoo.get("cnn"))
    assert report.notes == [
        "pin 'residual' -> 'dsp_cpu:1': operator 'residual' (relax.add) runs on host, because "
        "pattern 'dsp_cpu.add' refused it: its tensors take 24 KiB, more than a quarter of "
        "the 64 KiB TCM (16 KiB); pin it elsewhere"
    ]


class _Checked:
    """An accelerator 'picky' whose relu pattern is refused by ``check``."""

    UMAHUB_API = 1

    def __init__(self, check):
        self.check = check

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [umahub.Accelerator("picky")]

    @umahub.hookimpl(accelerator="picky")
    def umahub_patterns(self):
        from tvm.relax.dpl import is_op, wildcard

        return [("picky.relu", is_op("relax.nn.relu")(wildcard()), {}, self.check)]


@pytest.mark.parametrize(
    ("check", "why"),
    [
        (lambda ctx: False, "the check of pattern 'picky.relu' refused it (it gives no reason)"),
        (lambda ctx: None, "the check of pattern 'picky.relu' refused it (it gives no reason)"),
        (
            lambda ctx: Refusal(""),
            "the check of pattern 'picky.relu' refused it (it gives no reason)",
        ),
        (
            lambda ctx: Refusal("no relu on Tuesdays"),
            "pattern 'picky.relu' refused it: no relu on Tuesdays",
        ),
    ],
)
def test_a_check_that_returns_a_bool_still_refuses_and_is_reported(check, why):
    hub = umahub.Hub(
        config={"on-error": "error", "placement": {"n0": "picky"}},
        autoload=False,
        plugins=[_Checked(check)],
    )
    with pytest.raises(PlacementError) as info:
        hub.explain(chain())
    assert str(info.value) == (
        f"pin 'n0' -> 'picky': operator 'n0' (relax.nn.relu) runs on host, because {why}; "
        "pin it elsewhere"
    )


def test_a_check_that_takes_the_match_places_the_pin():
    hub = umahub.Hub(
        config={"on-error": "error", "placement": {"n0": "picky"}},
        autoload=False,
        plugins=[_Checked(lambda ctx: True)],
    )
    report = hub.explain(chain())
    assert [(o.name, o.device) for o in report.placement][:2] == [
        ("n0", "picky:0"),
        ("n1", "host"),
    ]


class _Pair(_Checked):
    """An accelerator 'picky' whose only pattern is relu followed by add."""

    @umahub.hookimpl(accelerator="picky")
    def umahub_patterns(self):
        from tvm.relax.dpl import is_op, wildcard

        pair = is_op("relax.add")(is_op("relax.nn.relu")(wildcard()), wildcard())
        return [("picky.relu_add", pair, {}, self.check)]


def test_a_match_holding_an_operator_pinned_elsewhere_says_which():
    hub = umahub.Hub(
        config={"on-error": "error", "placement": {"n0": "picky", "n1": "host"}},
        autoload=False,
        plugins=[_Pair(lambda ctx: True)],
    )
    with pytest.raises(PlacementError) as info:
        hub.explain(chain())
    assert str(info.value) == (
        "pin 'n0' -> 'picky': operator 'n0' (relax.nn.relu) runs on host, because pattern "
        "'picky.relu_add' refused it: the match also holds 'n1', pinned to 'host' by 'n1'; "
        "pin it elsewhere"
    )


def test_the_npu_takes_a_smaller_match_when_a_larger_one_holds_a_host_pin():
    hub = umahub.Hub(
        config={**BUNDLED, "placement": {"conv2": "npu", "conv2_relu": "host"}},
        project_config=False,
    )
    report = hub.explain(zoo.get("cnn"))
    by_name = {o.name: (o.device, o.pattern) for o in report.placement}
    assert by_name["conv2"] == ("npu:0", "npu.conv2d_bias")
    assert by_name["conv2_relu"] == ("host", "")


def test_report_text_gives_sizes_in_kib():
    hub = umahub.Hub(config={**BUNDLED, "priority": ["npu", "vanilla_accel", "dsp_cpu"]})
    text = str(hub.explain(zoo.get("cnn")))
    assert "  host -> vanilla_accel:0: 1 copy, 3 KiB, sync" in text
    assert "  npu:0 npu.dram: " in text and " of 1 GiB used (" in text
    assert " bytes" not in text


def _refusing(name, check):
    """An accelerator ``name`` whose relu pattern's check is ``check``."""

    class Plugin:
        UMAHUB_API = 1

        @umahub.hookimpl
        def umahub_accelerators(self):
            return [umahub.Accelerator(name)]

        @umahub.hookimpl(accelerator=name)
        def umahub_patterns(self):
            from tvm.relax.dpl import is_op, wildcard

            return [(f"{name}.relu", is_op("relax.nn.relu")(wildcard()), {}, check)]

    Plugin.__name__ = f"Refusing_{name}"
    return Plugin()


def test_explain_says_why_each_accelerator_refused_an_operator_not_pinned():
    hub = umahub.Hub(
        config={"on-error": "error", "priority": ["alpha", "beta"]},
        autoload=False,
        plugins=[
            _refusing("alpha", lambda ctx: Refusal("no relu on Tuesdays")),
            _refusing("beta", lambda ctx: False),
        ],
    )
    report = hub.explain(chain(ops=("relu", "add")))
    lines = str(report).splitlines()
    start = lines.index("refused by accelerators' checks (node: accelerator: reason):")
    assert lines[start - 1 : start + 3] == [
        "  operators per device: host: 2",
        "refused by accelerators' checks (node: accelerator: reason):",
        "  n0: alpha: no relu on Tuesdays",
        "  n0: beta: its check gives no reason",
    ]
    assert lines[start + 3] == "memory:"
    placement = json.loads(report.to_json())["placement"]
    assert [(o["name"], o["device"], o["refused"]) for o in placement] == [
        ("n0", "host", {"alpha": "no relu on Tuesdays", "beta": ""}),
        ("n1", "host", {}),
    ]


def test_an_operator_placed_elsewhere_keeps_the_refusal_of_the_accelerator_that_refused_it():
    hub = umahub.Hub(
        config={"on-error": "error", "priority": ["alpha", "beta"]},
        autoload=False,
        plugins=[
            _refusing("alpha", lambda ctx: Refusal("no relu on Tuesdays")),
            _refusing("beta", lambda ctx: True),
        ],
    )
    report = hub.explain(chain(ops=("relu", "add")))
    assert [(o.name, o.device, dict(o.refused)) for o in report.placement] == [
        ("n0", "beta:0", {"alpha": "no relu on Tuesdays"}),
        ("n1", "host", {}),
    ]
    assert "  n0: alpha: no relu on Tuesdays" in str(report).splitlines()


def test_the_accelerator_an_operator_runs_on_is_not_listed_as_refusing_it():
    # The bundled npu refuses conv1 (3 input channels): vanilla_accel takes it; the
    # dsp refuses the residual add (its TCM is too small): it stays on the host.
    hub = umahub.Hub(
        config={**BUNDLED, "priority": ["npu", "vanilla_accel", "dsp_cpu"]},
        project_config=False,
    )
    refused = {o.name: dict(o.refused) for o in hub.explain(zoo.get("cnn")).placement}
    channels = "3 input channels, not a multiple of the npu's 8-wide array"
    assert refused["conv1"] == {"npu": channels}
    assert refused["residual"] == {
        "dsp_cpu": "its tensors take 24 KiB, more than a quarter of the 64 KiB TCM (16 KiB)"
    }
    assert refused["conv2"] == {} and refused["fc"] == {}


def test_counts_in_the_report_and_the_summary_agree_with_their_nouns():
    from umahub.cli.summary import summary
    from umahub.sizes import counted

    assert [counted(1, "copy", "copies"), counted(2, "copy", "copies")] == ["1 copy", "2 copies"]
    assert [counted(0, "op"), counted(1, "op"), counted(3, "op")] == ["0 ops", "1 op", "3 ops"]
    hub = umahub.Hub(
        config={**BUNDLED, "priority": ["npu", "vanilla_accel", "dsp_cpu"]},
        project_config=False,
    )
    report = hub.explain(zoo.get("cnn"))
    lines = str(report).splitlines()
    in_place = "; in the host's memory: the VM reads {} in place"
    assert "  host -> vanilla_accel:0: 1 copy, 3 KiB, sync" + in_place.format("it") in lines
    assert "  npu:0 -> host: 2 copies, 8 KiB, async" + in_place.format("them") in lines
    assert (
        "  npu_2_matmul_add  [npu:0 (cpu,1,llvm,npu.dram)]  2 ops, patterns npu.matmul_bias"
        in lines
    )
    assert not [line for line in lines if "1 copies" in line or "(s)" in line]
    one = umahub.Hub(config={"plugins": ["dsp"]}, project_config=False).explain(
        chain(shape=(1, 8), ops=("relu",))
    )
    assert summary(one, 0.0).splitlines()[0] == (
        "placement: 1 of 1 operator on accelerators (dsp_cpu:0 1), 0 on the host"
    )
    assert (
        "  dsp_cpu_0_relu  [dsp_cpu:0 (cpu,1,c,dsp.tcm)]  1 op, patterns dsp_cpu.relu"
        in str(one).splitlines()
    )
