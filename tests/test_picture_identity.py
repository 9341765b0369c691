"""The picture names its model, colours each device alike everywhere, hides no text.

Titled with the report's ``model``; a device's colour depends on its name
alone (a stable hash into a fixed palette, a shade per instance), never on
which other devices a picture holds or their order; edges are drawn beneath
boxes and haloed labels; a name cut to fit carries the whole one in a
``<title>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest
from graphs import chain

import umahub
from umahub.plugin.context import Copy, Operator
from umahub.report.picture import device_colours, render_html, render_svg, save_picture
from umahub.report.picture.layout import GW
from umahub.report.picture.svg import HOST_COLOUR, device_colour
from umahub.report.report import PartitionReport, Report

SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class EdgeOperator(Operator):
    """An operator carrying its data edges."""

    inputs: tuple[str, ...] = ()


def report_of(devices: list[str], model: str = "") -> Report:
    """One operator per device, in the given order."""
    ops = [
        Operator(f"op{k}", "relax.nn.relu", d, "" if d == "host" else f"{d.split(':')[0]}.relu")
        for k, d in enumerate(devices)
    ]
    return Report(ops, [], list(devices), [], model=model)


def op_fills(svg: str) -> dict[str, str]:
    root = ET.fromstring(svg)
    return {
        e.get("data-device"): e.get("fill")
        for e in root.iter(f"{SVG}rect")
        if e.get("class") == "op"
    }


# ---------------------------------------------------------------- the model's name


def test_the_picture_is_titled_with_the_reports_model(tmp_path):
    report = report_of(["host", "npu:0"], model="resnet18")
    root = ET.parse(save_picture(report, tmp_path / "picture.svg")).getroot()
    assert root.find(f"{SVG}title").text == "resnet18: umahub placement and timeline"
    heading = next(root.iter(f"{SVG}text"))
    assert heading.text == "resnet18: 2 operators, 0 partitions, 0 copies (0 B) per inference"
    page = render_html(report)
    assert "<title>umahub: resnet18</title>" in page and "<h1>umahub: resnet18</h1>" in page


def test_an_explicit_title_wins_and_the_file_name_is_the_last_resort(tmp_path):
    named = report_of(["host"], model="bert")
    assert "<title>given: umahub" in render_svg(named, title="given")
    unnamed = report_of(["host"])
    root = ET.parse(save_picture(unnamed, tmp_path / "cnn_plan.svg")).getroot()
    assert root.find(f"{SVG}title").text == "cnn_plan: umahub placement and timeline"


def test_compile_and_explain_put_the_model_name_in_the_report():
    hub = umahub.Hub(config={"plugins": ["alpha"]})
    report = hub.explain(chain(), model="chain")
    assert (report.model, report.to_dict()["model"]) == ("chain", "chain")
    assert hub.explain(chain()).model == ""


# ---------------------------------------------------------------- colours


def test_a_device_has_one_colour_whatever_the_picture_holds():
    first = op_fills(render_svg(report_of(["host", "npu:0", "dsp_cpu:0", "dsp_cpu:1"])))
    second = op_fills(
        render_svg(report_of(["dsp_cpu:1", "vanilla_accel:0", "npu:0", "alpha_accel:0"]))
    )
    assert first["npu:0"] == second["npu:0"] == "#4e79a7"
    assert first["dsp_cpu:1"] == second["dsp_cpu:1"] == "#a4cb9e"  # a shade of dsp_cpu's green
    assert first["dsp_cpu:0"] == "#59a14f"
    assert first["host"] == HOST_COLOUR
    assert second["vanilla_accel:0"] == "#f28e2b"
    assert {d: device_colour(d) for d in first} == first


def test_two_accelerators_of_one_hue_are_told_apart_by_name_not_by_order():
    # 'beta_accel' and 'flaky' hash to one hue: the later name takes the next one.
    assert device_colour("beta_accel:0") == device_colour("flaky:0")
    one = device_colours(["flaky:0", "beta_accel:0", "host"])
    other = device_colours(["host", "beta_accel:0", "flaky:0"])
    assert one == other
    assert one["beta_accel:0"] == device_colour("beta_accel:0")
    assert one["flaky:0"] != one["beta_accel:0"]


# ---------------------------------------------------------------- edges and text


def edge_report() -> Report:
    ops = [
        EdgeOperator("a", "relax.nn.conv2d", "host"),
        EdgeOperator("b", "relax.matmul", "npu:0", "npu.matmul", "p1", inputs=("a",)),
        EdgeOperator("c", "relax.nn.relu", "host", inputs=("b",)),
        EdgeOperator("d", "relax.add", "dsp:0", "dsp.add", "p2", inputs=("c", "a")),
    ]
    copies = [
        Copy("a", "host", "npu:0", 4096, "async"),
        Copy("b", "npu:0", "host", 4096, "async"),
        Copy("c", "host", "dsp:0", 4096, "sync"),
        Copy("a", "host", "dsp:0", 4096, "sync"),
    ]
    return Report(ops, [], ["host", "npu:0", "dsp:0"], copies)


def test_edges_are_drawn_beneath_boxes_and_labels():
    root = ET.fromstring(render_svg(edge_report()))
    order = list(root.iter())
    edges = [e for e in order if e.get("class") == "edge"]
    assert ["".join(e.itertext()) for e in edges] == ["a -> d"]
    first_box = next(e for e in order if e.get("class") == "group")
    first_label = next(e for e in order if e.get("class") == "copy-label")
    assert order.index(edges[-1]) < order.index(first_box) < order.index(first_label)
    for box in (e for e in order if e.get("class") == "group"):
        assert box.find(f"{SVG}rect").get("fill") == "#ffffff"  # covers what runs beneath
    labels = [e for e in order if e.get("class") == "copy-label"]
    assert labels and all(
        (t.get("paint-order"), t.get("stroke")) == ("stroke", "#ffffff") for t in labels
    )


def test_an_edge_runs_from_box_border_to_box_border():
    root = ET.fromstring(render_svg(edge_report()))
    boxes = [
        float(g.find(f"{SVG}rect").get("x"))
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "group"
    ]  # a (host), b (p1), c (host), d (p2)
    edge = next(e for e in root.iter(f"{SVG}path") if e.get("class") == "edge")
    start, end = edge.get("d").split(" C")[0], edge.get("d").split(" ")[-1]
    assert float(start[1:].split(",")[0]) == pytest.approx(boxes[0] + GW, abs=0.05)
    assert float(end.split(",")[0]) == pytest.approx(boxes[3], abs=0.05)


def test_a_name_cut_to_fit_shows_the_whole_one_on_hover():
    long = "encoder.layer.0.attention.self.query_key_value_projection_matmul"
    report = Report(
        [Operator(long, "relax.matmul", "npu:0", "npu.matmul", "p_npu")],
        [PartitionReport("p_npu", "npu", "npu:0", ("npu.matmul",), 1)],
        ["npu:0"],
        [],
    )
    svg = render_svg(report)
    root = ET.fromstring(svg)
    cut = [t for t in root.iter(f"{SVG}text") if (t.find(f"{SVG}title") is not None)]
    assert [t.find(f"{SVG}title").text for t in cut] == [long]
    shown = "".join(cut[0].itertext()).removeprefix(long)
    assert shown.endswith("…") and long.startswith(shown[:-1]) and len(shown) < len(long)
    rows = [g for g in root.iter(f"{SVG}g") if g.get("class") == "op-row"]
    assert rows[0].find(f"{SVG}title").text.startswith(f"{long}: relax.matmul on npu:0")
    assert f"<title>{long}</title>" in render_html(report)


def test_a_name_that_fits_has_no_extra_title():
    root = ET.fromstring(render_svg(report_of(["host", "npu:0"])))
    assert not [t for t in root.iter(f"{SVG}text") if t.find(f"{SVG}title") is not None]
