"""The report's picture: the placement graph and the timeline estimate (no TVM compile)."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest

from umahub.plugin.context import Copy, Operator
from umahub.plugin.memory import MemoryPlan, PoolUse
from umahub.report.picture import (
    ACCELERATOR_FLOPS,
    BANDWIDTH,
    HOST_FLOPS,
    Span,
    device_colours,
    estimate_flops,
    render_svg,
    save_picture,
    timeline,
)
from umahub.report.report import PartitionReport, Report

SVG = "{http://www.w3.org/2000/svg}"
MS = 1e-3


@dataclass(frozen=True)
class EdgeOperator(Operator):
    """An operator as a report that carries data edges and FLOPs would hold it."""

    inputs: tuple[str, ...] = ()
    flops: int = 0


def small_report() -> Report:
    """conv on the host, matmul on the NPU (async pool), relu on a DSP (sync pool).

    Default cost model: conv 100 MFLOP / 10 GFLOP/s = 10 ms; matmul 20 MFLOP /
    100 GFLOP/s = 0.2 ms; relu 0.1 MFLOP / 100 GFLOP/s = 1 us; copies 10 GB/s.
    """
    ops = [
        Operator("conv", "relax.nn.conv2d", "host"),
        Operator("mm", "relax.matmul", "npu:0", "npu.matmul", "p_npu"),
        Operator("act", "relax.nn.relu", "dsp:0", "dsp.relu", "p_dsp", pinned="relu*"),
    ]
    copies = [
        Copy("weight", "host", "npu:0", 123_456, "async", constant=True, when="load"),  # once
        Copy("constant", "host", "npu:0", 4_000_000, "async", constant=True),  # 0.4 ms
        Copy("conv", "host", "npu:0", 1_000_000, "async"),  # 0.1 ms once conv is done
        Copy("lv1", "npu:0", "dsp:0", 100_000, "sync"),  # 10 us, blocks npu:0 and dsp:0
        Copy("act", "dsp:0", "host", 400, "sync"),  # the output: 40 ns
    ]
    partitions = [
        PartitionReport("p_npu", "npu", "npu:0", ("npu.matmul",), 1),
        PartitionReport("p_dsp", "dsp", "dsp:0", ("dsp.relu",), 1),
    ]
    memory = MemoryPlan(
        pools=(
            PoolUse("npu:0", "npu.sram", 262144, "async", resident=123_456),
            PoolUse("dsp:0", "dsp.tcm", 65536, "sync"),
        ),
        host_bytes=1024,
    )
    return Report(ops, partitions, ["host", "npu:0", "dsp:0"], copies, memory, built=False)


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def spans_of(spans: list[Span], label: str) -> list[Span]:
    return [s for s in spans if s.label == label]


# ---------------------------------------------------------------------- the timeline


def test_timeline_sequential_program_exact_numbers():
    spans = timeline(small_report())
    by = {(s.lane, s.label): s for s in spans}
    assert by["npu:0 DMA", "copy constant host->npu:0"] == pytest.approx(
        Span("npu:0 DMA", 0.0, 0.4 * MS, "copy constant host->npu:0")
    )
    assert by["host", "conv"][1:3] == pytest.approx((0.0, 10 * MS))
    assert by["npu:0 DMA", "copy conv host->npu:0"][1:3] == pytest.approx((10 * MS, 10.1 * MS))
    assert by["npu:0", "mm"][1:3] == pytest.approx((10.1 * MS, 10.3 * MS))
    # a sync copy takes the lane of its accelerator end (between two accelerators,
    # the one it goes to), as the concurrent executor runs it
    assert by["dsp:0", "copy lv1 npu:0->dsp:0"][1:3] == pytest.approx((10.3 * MS, 10.31 * MS))
    assert by["dsp:0", "act"][1:3] == pytest.approx((10.31 * MS, 10.311 * MS))
    # the output copy goes back to the host after the last operator, done by the DSP
    assert by["dsp:0", "copy act dsp:0->host"][1:3] == pytest.approx(
        (10.311 * MS, 10.311 * MS + 400 / BANDWIDTH)
    )
    assert len(spans) == 7
    assert max(s.end for s in spans) == pytest.approx(10.311 * MS + 4e-8)


def test_async_copy_overlaps_compute_and_its_consumer_waits():
    spans = timeline(small_report())
    weights = spans_of(spans, "copy constant host->npu:0")[0]
    conv = spans_of(spans, "conv")[0]
    mm = spans_of(spans, "mm")[0]
    assert weights.lane == "npu:0 DMA" and conv.lane == "host"
    assert weights.start < conv.end and conv.start < weights.end  # runs while the host computes
    assert mm.start >= max(s.end for s in spans if s.lane == "npu:0 DMA" and s.end <= mm.start)


def test_a_sync_copy_takes_its_accelerator_ends_lane_and_blocks_the_program():
    spans = timeline(small_report())
    copy = spans_of(spans, "copy lv1 npu:0->dsp:0")
    assert {s.lane for s in copy} == {"dsp:0"}
    act = spans_of(spans, "act")[0]
    assert act.start == pytest.approx(copy[0].end)


def test_throughput_and_bandwidth_can_be_given():
    spans = timeline(
        small_report(), throughput={"host": 1e9, "npu": 1e10, "dsp:0": 1e5}, bandwidth=1e9
    )
    assert spans_of(spans, "conv")[0].end == pytest.approx(0.1)  # 100 MFLOP at 1 GFLOP/s
    mm = spans_of(spans, "mm")[0]
    assert mm.end - mm.start == pytest.approx(2 * MS)
    act = spans_of(spans, "act")[0]
    assert act.end - act.start == pytest.approx(1.0)
    weights = spans_of(spans, "copy constant host->npu:0")[0]
    assert weights.end == pytest.approx(4 * MS)


def test_flops_from_the_report_win_over_the_default():
    assert estimate_flops(Operator("c", "relax.nn.conv2d")) == 100e6
    assert estimate_flops(Operator("m", "relax.matmul")) == 20e6
    assert estimate_flops(Operator("n", "relax.nn.layer_norm")) == 1e6
    assert estimate_flops(Operator("r", "relax.reshape")) == 1e5
    assert estimate_flops(EdgeOperator("c", "relax.nn.conv2d", flops=7)) == 7
    assert HOST_FLOPS < ACCELERATOR_FLOPS


def test_edges_let_independent_operators_run_side_by_side():
    ops = [
        EdgeOperator("a", "relax.nn.conv2d", "host"),
        EdgeOperator("b", "relax.matmul", "npu:0", "npu.matmul", "p_npu"),
        EdgeOperator("c", "relax.add", "host", inputs=("a", "b")),
    ]
    copies = [Copy("lv", "npu:0", "host", 1000, "async")]
    report = Report(
        ops,
        [PartitionReport("p_npu", "npu", "npu:0", ("npu.matmul",), 1)],
        ["host", "npu:0"],
        copies,
    )
    spans = {s.label: s for s in timeline(report)}
    assert spans["a"][1:3] == pytest.approx((0.0, 10 * MS))
    assert spans["b"][1:3] == pytest.approx((0.0, 0.2 * MS))  # not after a: no edge a -> b
    assert spans["copy lv npu:0->host"][1:3] == pytest.approx((0.2 * MS, 0.2 * MS + 1e-7))
    assert spans["copy lv npu:0->host"].lane == "npu:0 DMA"
    assert spans["c"][1:3] == pytest.approx((10 * MS, 10.01 * MS))
    # without edges the same operators are a sequential program
    plain = [Operator(o.name, o.op, o.device, o.pattern, o.partition) for o in ops]
    spans = {s.label: s for s in timeline(Report(plain, report.partitions, report.devices, copies))}
    assert spans["b"].start == pytest.approx(10 * MS)


def test_named_producer_and_consumer_place_the_copy():
    ops = [
        Operator("m1", "relax.matmul", "npu:0", "npu.matmul", "p1"),
        Operator("r", "relax.nn.relu", "host"),
        Operator("m2", "relax.matmul", "npu:0", "npu.matmul", "p2"),
    ]
    # without names, the weights would go to the first NPU group (p1); named, to m2's
    copies = [Copy("constant", "host", "npu:0", 2_000_000, "async", True, consumer="p2")]
    report = Report(ops, [], ["host", "npu:0"], copies)
    spans = {s.label: s for s in timeline(report)}
    assert spans["m1"].start == 0.0
    assert spans["copy constant host->npu:0"][1:3] == pytest.approx((0.0, 0.2 * MS))
    assert spans["m2"].start == pytest.approx(max(0.2 * MS, spans["r"].end))
    plain = Report(
        ops, [], ["host", "npu:0"], [Copy("constant", "host", "npu:0", 2_000_000, "async", True)]
    )
    assert {s.label: s for s in timeline(plain)}["m1"].start == pytest.approx(0.2 * MS)


# ---------------------------------------------------------------------- the SVG


def test_svg_is_well_formed_with_one_coloured_element_per_operator(tmp_path):
    report = small_report()
    path = save_picture(report, tmp_path / "model.svg")
    assert path == str(tmp_path / "model.svg")
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    colours = device_colours(report.devices)
    assert len(set(colours.values())) == 3
    ops = [e for e in root.iter(f"{SVG}rect") if e.get("class") == "op"]
    assert [e.get("data-node") for e in ops] == ["conv", "mm", "act"]
    for element, op in zip(ops, report.placement, strict=True):
        assert element.get("fill") == colours[op.device]
        assert element.get("data-device") == op.device
    assert ops[2].get("stroke")  # the pinned operator is outlined


def test_copy_markers_say_bytes_and_kind():
    root = parse(render_svg(small_report()))
    copies = [g for g in root.iter(f"{SVG}g") if g.get("class") == "copy"]
    assert [(g.get("data-tensor"), g.get("data-bytes"), g.get("data-kind")) for g in copies] == [
        ("constant", "4000000", "async"),
        ("conv", "1000000", "async"),
        ("lv1", "100000", "sync"),
        ("act", "400", "sync"),
    ]
    labels = ["".join(t.itertext()) for g in copies for t in g.iter(f"{SVG}text")]
    assert labels == ["3.8 MiB async", "977 KiB async", "98 KiB sync", "400 B sync"]
    dashed = [g.find(f"{SVG}line").get("stroke-dasharray") for g in copies]
    assert dashed[0] and dashed[1] and not dashed[2] and not dashed[3]


def test_timeline_has_a_lane_per_device_and_a_dma_lane_per_async_accelerator():
    root = parse(render_svg(small_report()))
    lanes = [g.get("data-lane") for g in root.iter(f"{SVG}g") if g.get("class") == "lane"]
    assert lanes == ["host", "npu:0", "npu:0 DMA", "dsp:0"]
    spans = [r for r in root.iter(f"{SVG}rect") if (r.get("class") or "").startswith("span")]
    assert len(spans) == len(timeline(small_report()))
    async_spans = [r for r in spans if r.get("class") == "span async"]
    assert {r.get("data-lane") for r in async_spans} == {"npu:0 DMA"}
    text = " ".join(root.itertext())
    assert "total 10.3 ms" in text
    assert "busy: host 10 ms" in text and "npu:0 DMA 500 µs" in text
    assert "cost model" in text and "10 GB/s" in text


def test_long_groups_collapse_but_keep_every_operator():
    ops = [
        Operator(f"conv{i}", "relax.nn.conv2d", "npu:0", "npu.conv2d", "p_big") for i in range(120)
    ]
    ops += [Operator(f"h{i}", "relax.add", "host") for i in range(150)]
    report = Report(
        ops,
        [PartitionReport("p_big", "npu", "npu:0", ("npu.conv2d",), 120)],
        ["host", "npu:0"],
        [Copy("lv", "npu:0", "host", 8, "async")],
    )
    root = parse(render_svg(report))
    rects = [e for e in root.iter(f"{SVG}rect") if e.get("class") == "op"]
    assert len(rects) == 270
    assert {e.get("data-node") for e in rects} == {o.name for o in ops}
    text = " ".join(root.itertext())
    assert "+112 more: 112 conv2d" in text and "+142 more: 142 add" in text
    assert float(root.get("height")) < 1000  # 270 operators, still one screen or so


def test_many_groups_wrap_into_rows_within_the_width():
    ops = []
    for i in range(120):
        ops.append(Operator(f"c{i}", "relax.nn.conv2d", "npu:0", "npu.conv2d", f"p{i}"))
        ops.append(Operator(f"r{i}", "relax.nn.relu", "host"))
    copies = [
        c
        for i in range(120)
        for c in (
            Copy(f"r{i - 1}", "host", "npu:0", 64, "async"),
            Copy(f"lv{i}", "npu:0", "host", 64, "async"),
        )
    ]
    report = Report(ops, [], ["host", "npu:0"], copies)
    root = parse(render_svg(report, width=1400))
    assert root.get("width") == "1400"
    boxes = [g for g in root.iter(f"{SVG}g") if g.get("class") == "group"]
    assert len(boxes) == 240
    xs = [float(r.get("x")) + float(r.get("width")) for g in boxes for r in g.iter(f"{SVG}rect")]
    assert max(xs) <= 1400


def test_edges_are_drawn_when_the_report_has_them():
    ops = [
        EdgeOperator("a", "relax.nn.conv2d", "host"),
        EdgeOperator("b", "relax.matmul", "npu:0", "npu.matmul", "p1", inputs=("a",)),
        EdgeOperator("c", "relax.nn.relu", "host", inputs=("b",)),
        EdgeOperator("d", "relax.add", "dsp:0", "dsp.add", "p2", inputs=("c", "a")),
    ]
    root = parse(render_svg(Report(ops, [], ["host", "npu:0", "dsp:0"], [])))
    edges = [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]
    assert ["".join(p.itertext()) for p in edges] == ["a -> d"]  # only the one that skips
    plain = [Operator(o.name, o.op, o.device, o.pattern, o.partition) for o in ops]
    root = parse(render_svg(Report(plain, [], ["host", "npu:0", "dsp:0"], [])))
    assert not [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]


def test_weights_loaded_once_stay_out_of_the_inference():
    report = small_report()
    assert all("weight" not in s.label for s in timeline(report))
    root = parse(render_svg(report))
    markers = [g.get("data-tensor") for g in root.iter(f"{SVG}g") if g.get("class") == "copy"]
    assert "weight" not in markers
    text = " ".join(root.itertext())
    assert "4 copies (4.9 MiB) per inference (+1 weight, 121 KiB, copied once at load)" in text
    assert "npu:0 (1 op, weights 121 KiB)" in text
    assert not [g for g in root.iter(f"{SVG}g") if g.get("class") == "load-copy"]
    # a load copy that names its partition is shown on that partition's box
    report.copies[0] = Copy(
        "weight", "host", "npu:0", 123_456, "async", True, "load", consumer="p_npu"
    )
    root = parse(render_svg(report))
    badges = [g for g in root.iter(f"{SVG}g") if g.get("class") == "load-copy"]
    assert [b.get("data-bytes") for b in badges] == ["123456"]
    assert "weights 121 KiB" in "".join(badges[0].itertext())


def test_fallbacks_are_named_and_an_empty_report_still_draws():
    report = small_report()
    report.partitions.append(
        PartitionReport("p_gone", "dsp", "dsp:1", ("dsp.add",), 2, fallback="needs 9 bytes, 1 free")
    )
    text = " ".join(parse(render_svg(report)).itertext())
    assert "1 partition fell back" in text and "needs 9 bytes, 1 free" in text
    empty = parse(render_svg(Report([], [], ["host"])))
    assert "total 0" in " ".join(empty.itertext())


# ---------------------------------------------------------------------- HTML and suffixes


def test_html_holds_the_svg_and_the_table(tmp_path):
    report = small_report()
    path = report.save_picture(str(tmp_path / "model.html"))
    page = (tmp_path / "model.html").read_text()
    assert path.endswith("model.html")
    assert page.startswith("<!DOCTYPE html>")
    svg = re.search(r"<svg .*?</svg>", page, re.S).group(0)
    assert len([e for e in parse(svg).iter(f"{SVG}rect") if e.get("class") == "op"]) == 3
    assert f'<pre class="report">{html.escape(str(report))}</pre>' in page
    assert "placement:" in page and "copies per inference:" in page
    assert "weights 121 KiB loaded once" in page
    for device in report.devices:
        assert f"{device} (" in page  # the legend


@pytest.mark.parametrize("name", ["model.png", "model", "model.svg.gz", "model.htm"])
def test_other_suffixes_are_refused_with_the_allowed_ones(tmp_path, name):
    with pytest.raises(ValueError, match=r"must be one of \.svg, \.html"):
        save_picture(small_report(), tmp_path / name)
    assert not (tmp_path / name).exists()


def test_suffix_is_case_insensitive(tmp_path):
    path = save_picture(small_report(), tmp_path / "MODEL.SVG")
    ET.parse(path)
