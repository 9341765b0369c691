"""The benchmarks page, written from the result files at build time.

Every ``benchmarks/results/*.json`` (and ``suites/results/*.json``) becomes a
section: what the benchmark measures (its script's docstring), the machine and
the versions recorded in the file, and its numbers as tables. A file of a
shape this module does not know still gets a section, with the numbers it
finds at its top levels, so a new benchmark shows up before it gets a table
of its own.

Nothing here imports umahub or TVM: the page is data and text only. Run it to
see the reStructuredText it produces::

    python docs/_ext/benchmarks_page.py
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIRS = (ROOT / "benchmarks" / "results", ROOT / "suites" / "results")

Row = Sequence[Any]


# ------------------------------------------------------------------ text helpers


def _escape(value: Any) -> str:
    """A table cell's text with reStructuredText's inline markup characters made plain."""
    text = str(value)
    for char in ("\\", "*", "`", "|", "_"):
        text = text.replace(char, "\\" + char)
    return text


def _code(value: Any) -> str:
    return f"``{value}``" if value not in (None, "") else ""


def _ms(seconds_or_ms: float | None, *, seconds: bool = False) -> str:
    if seconds_or_ms is None or (isinstance(seconds_or_ms, float) and math.isnan(seconds_or_ms)):
        return "-"
    ms = seconds_or_ms * 1e3 if seconds else seconds_or_ms
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.3f} ms"


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 10:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds:.2f} s"


def _ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _table(header: Row | None, rows: Iterable[Row], title: str = "") -> list[str]:
    """A ``list-table`` directive (every cell escaped unless it is already markup).

    Without a ``header``, the first column names the rows.
    """
    rows = list(rows)
    if not rows:
        return []
    options = ["   :header-rows: 1"] if header else ["   :stub-columns: 1"]
    lines = [f".. list-table:: {title}".rstrip(), *options, ""]
    for row in [header, *rows] if header else rows:
        cells = [c if isinstance(c, _Markup) else _escape(c) for c in row]
        lines.append(f"   * - {cells[0] or ' '}")
        lines += [f"     - {c or ' '}" for c in cells[1:]]
    return [*lines, ""]


class _Markup(str):
    """A cell that is reStructuredText already (a literal), not text to escape."""


def _lit(value: Any) -> _Markup:
    return _Markup(_code(value))


# ------------------------------------------------------------------ the machine


def _machine(data: dict[str, Any]) -> list[tuple[str, str]]:
    """What the file says it was measured on, as (what, value) pairs, in a fixed order.

    The files record it in three shapes: ``machine`` with its ``versions``;
    ``meta`` (the npu's kernels); ``machine`` and ``versions`` side by side
    (the ONNX suite).
    """
    m = dict(data.get("machine") or data.get("meta") or {})
    versions = {**(m.get("versions") or {}), **(data.get("versions") or {})}
    for key, name in (
        ("apache-tvm", "apache-tvm"),
        ("apache-tvm-ffi", "apache-tvm-ffi"),
        ("umahub", "umahub"),
        ("numpy", "numpy"),
        ("tvm_version", "tvm"),
        ("numpy_version", "numpy"),
    ):
        if key in m:
            versions[name] = m[key]
    python = m.get("python") or versions.pop("python", None)
    versions.pop("python", None)
    pairs: list[tuple[str, str]] = []
    cpu = m.get("cpu") or m.get("cpu_model")
    cores = m.get("cores") or m.get("cpus")
    if cpu or cores:
        pairs.append(("CPU", ", ".join(str(x) for x in (cpu, cores and f"{cores} cores") if x)))
    if m.get("llvm_cpu"):
        pairs.append(("LLVM CPU", str(m["llvm_cpu"])))
    system = m.get("platform") or " ".join(
        str(m[k]) for k in ("system", "release", "machine") if isinstance(m.get(k), str)
    )
    if system:
        pairs.append(("system", system))
    if python:
        pairs.append(("Python", str(python)))
    for key in ("TVM_NUM_THREADS", "tvm_num_threads", "OPENBLAS_NUM_THREADS"):
        if key in m:
            value = m[key]
            shown = "not set (TVM's default)" if value in (None, "default") else str(value)
            pairs.append((key.upper(), shown))
    if versions:
        pairs.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items())))
    when = m.get("when") or data.get("created")
    if when:
        pairs.append(
            ("measured", re.sub(r"(\d)T(\d)", r"\1 \2", str(when)).replace("+00:00", " UTC"))
        )
    return pairs


def _settings(data: dict[str, Any], keys: Iterable[str]) -> list[tuple[str, str]]:
    return [(k.replace("_", " "), str(data[k])) for k in keys if k in data]


# ------------------------------------------------------------------ one renderer per file


def _engines(data: dict[str, Any]) -> list[str]:
    models = data.get("models", {})
    baseline = any("before" in row for row in models.values())
    header = ["model", "PyTorch eager", "ONNX Runtime", "umahub"]
    if baseline:
        header.append("umahub, baseline checkout")
    header += ["umahub / PyTorch", "umahub / ONNX Runtime"]
    if baseline:
        header.append("umahub / baseline")
    header += ["relative error against PyTorch: ORT, umahub", "compile + import (umahub)"]
    rows = []
    for name, row in models.items():
        u = row.get("umahub", {})
        cells = [
            name,
            _ms(row.get("torch", {}).get("median_ms")),
            _ms(row.get("ort", {}).get("median_ms")),
            _ms(u.get("median_ms")),
        ]
        if baseline:
            cells.append(_ms(row.get("before", {}).get("median_ms")))
        cells += [_ratio(row.get("umahub_over_torch")), _ratio(row.get("umahub_over_ort"))]
        if baseline:
            cells.append(_ratio(row.get("umahub_over_before")))
        cells.append(f"{_error(row.get('ort', {}))}, {_error(u)}")
        cells.append(f"{_s(u.get('compile_s'))} + {_s(u.get('import_s'))}")
        rows.append(cells)
    return _table(header, rows, "Latency, median of the best round")


def _error(result: dict[str, Any]) -> str:
    """An engine's relative error against PyTorch, ``invalid`` past the benchmark's bound
    (results from before it recorded the relative error: "-")."""
    rel = result.get("rel_error")
    if rel is None:
        return "-"
    return f"{rel:.1e}" + ("" if result.get("valid", True) else " (invalid)")


def _language_models(data: dict[str, Any]) -> list[str]:
    engines = (("torch", "PyTorch eager"), ("tvm", "plain TVM"), ("umahub", "umahub"))
    prompt = data.get("prompt_tokens", "")
    header = ["model", "engine", f"prefill, {prompt} tokens", "decode, tokens/s", "tokens equal"]
    header += ["prefill error", "compile"]
    rows = []
    for name, row in data.get("models", {}).items():
        for key, label in engines:
            r = row.get(key)
            if r is None:
                continue
            if "error" in r:
                rows.append([name, label, f"failed: {r['error']}", "", "", "", ""])
                continue
            equal = r.get("tokens_equal")
            rows.append(
                [
                    name,
                    label,
                    _ms(r.get("prefill_ms")),
                    f"{r['decode_tokens_per_s']:.1f}",
                    "-" if equal is None else ("yes" if equal else "no"),
                    _err(r.get("relative_error")),
                    _s(r.get("compile_s")),
                ]
            )
    lines = _table(header, rows, "Prefill and decode, the fastest round of each engine")
    ratios = [
        [
            name,
            _ratio(row.get("prefill_umahub_over_torch")),
            _ratio(row.get("decode_umahub_over_torch")),
            _ratio(row.get("prefill_umahub_over_tvm")),
            _ratio(row.get("decode_umahub_over_tvm")),
        ]
        for name, row in data.get("models", {}).items()
    ]
    header = [
        "model",
        "prefill time / PyTorch's",
        "decode tokens/s / PyTorch's",
        "prefill time / plain TVM's",
        "decode tokens/s / plain TVM's",
    ]
    return lines + _table(header, ratios, "umahub against the others")


def _auto(data: dict[str, Any]) -> list[str]:
    header = [
        "model",
        "auto",
        "best other placement",
        "auto / best",
        "worst by rounds (against)",
        "chance",
        "noise",
        "verdict",
        "auto kept",
        "auto's estimate",
        "compile, first / cached",
    ]
    rows = []
    for name, row in data.get("models", {}).items():
        a = row.get("auto", {})
        if "verdict" not in a:
            continue
        best, against = a.get("best_other"), a.get("against")
        kept = (a.get("finalists") or {}).get("kept", "auto")
        kept = "its own choice" if kept == "auto" else kept.removeprefix("priority ")
        rows.append(
            [
                name,
                _ms(a.get("median_ms")),
                f"{_ms(row.get(best, {}).get('median_ms'))} ({best})",
                _ratio(a.get("over_best_other")),
                f"{_ratio(a.get('paired', {}).get(against), 3)} ({against})",
                _ratio(a.get("chance", {}).get(against)),
                _pct(100 * a["noise"]) if "noise" in a else "-",
                a["verdict"],
                kept,
                _ms(a.get("estimate_ms")),
                f"{_s(a.get('compile_s'))} / {_s(a.get('cached_compile_s'))}",
            ]
        )
    lines = _table(
        header, rows, "Placement by cost against the six claiming orders and each accelerator alone"
    )
    header = ["model", *[k for k in next(iter(data.get("models", {}).values()), {}) if k != "auto"]]
    rows = []
    for name, row in data.get("models", {}).items():
        rows.append([name, *[_ms(row.get(k, {}).get("median_ms")) for k in header[1:]]])
    return lines + _table(header, rows, "Every placement's latency (its best round)")


def _concurrency(data: dict[str, Any]) -> list[str]:
    header = [
        "case",
        "VM latency",
        "concurrent latency",
        "VM / concurrent",
        "VM throughput",
        "concurrent throughput",
        "concurrent / VM",
        "auto chose",
        "steps",
    ]
    rows = []
    for name, r in data.get("results", {}).items():
        rows.append(
            [
                name,
                _ms(r.get("vm_latency"), seconds=True),
                _ms(r.get("concurrent_latency"), seconds=True),
                _ratio(r.get("latency_ratio")),
                f"{r.get('vm_throughput', 0):.1f}/s",
                f"{r.get('concurrent_throughput', 0):.1f}/s",
                _ratio(r.get("throughput_ratio")),
                r.get("auto_chose", "-"),
                r.get("steps", "-"),
            ]
        )
    return _table(header, rows, "The quietest round of each case")


def _compile_overhead(data: dict[str, Any]) -> list[str]:
    header = [
        "model",
        "plain tvm.compile",
        "umahub, no plugins",
        "overhead",
        "umahub's own stages",
        "their share",
    ]
    rows = [
        [
            name,
            _s(r.get("plain_tvm_s")),
            _s(r.get("umahub_no_plugins_s")),
            _pct(r.get("overhead_pct")),
            _s(r.get("umahub_own_stages_s")),
            _pct(r.get("own_stages_pct")),
        ]
        for name, r in data.get("models", {}).items()
    ]
    return _table(header, rows, "Compile time, medians")


def _npu_kernels(data: dict[str, Any]) -> list[str]:
    header = [
        "kernel",
        "strategy",
        "GFLOP",
        "unscheduled",
        "npu schedule",
        "numpy",
        "npu GFLOP/s",
        "npu / unscheduled",
        "largest relative error",
    ]
    rows = [
        [
            _lit(k.get("kernel")),
            k.get("strategy"),
            f"{k.get('gflop', 0):.3f}",
            _ms(k.get("default_ms")),
            _ms(k.get("npu_ms")),
            _ms(k.get("numpy_ms")),
            f"{k.get('npu_gflops', 0):.1f}",
            f"x{k.get('speedup_vs_default', 0):.1f}",
            _err(k.get("max_rel_err")),
        ]
        for k in data.get("kernels", [])
    ]
    return _table(header, rows, "Medians")


def _plugin_loading(data: dict[str, Any]) -> list[str]:
    hook = data.get("hook_call", {})
    rows = [
        ["installed plugins", data.get("plugins", "-")],
        ["Hub() with them", _ms(data.get("hub_seconds"), seconds=True)],
        ["their own imports", _ms(data.get("imports_seconds"), seconds=True)],
        ["discovery beyond the imports", _ms(data.get("discovery_overhead_ms"))],
        ["target for discovery", _ms(data.get("target_discovery_overhead_ms"))],
        [
            f"one hook call, {hook.get('implementations', '?')} implementations, umahub",
            f"{hook.get('umahub_us', 0):.1f} us",
        ],
        ["the same call, plain pluggy", f"{hook.get('pluggy_us', 0):.1f} us"],
        [
            "umahub's overhead per call (target)",
            f"{hook.get('overhead_us', 0):.1f} us ({data.get('target_hook_overhead_us', '-')} us)",
        ],
    ]
    return _table(["what", "time"], rows)


def _remote_overhead(data: dict[str, Any]) -> list[str]:
    header = ["", "min", "median", "p90", "max"]
    rows = []
    for key, label in (
        ("local_latency_ms", "here"),
        ("remote_latency_ms", "on the board, through RPC"),
        ("remote_main_on_board_ms", "main alone, timed on the board"),
    ):
        r = data.get(key)
        if r:
            rows.append([label, *[_ms(r.get(s)) for s in ("min", "median", "p90", "max")]])
    lines = [_escape(data["what"]), ""] if "what" in data else []
    return lines + _table(header, rows, "Latency")


def _scaling(data: dict[str, Any]) -> list[str]:
    def rows_of(rows: list[dict], extra: Callable[[dict], list[Any]]) -> list[list[Any]]:
        return [[f"{r['operators']:,}", _s(r.get("seconds")), *extra(r)] for r in rows]

    stages = ("plan", "partition", "memory", "copies")

    def per_stage(r: dict) -> list[Any]:
        return [
            f"{r.get('per_operator_us', 0):.0f} us",
            r.get("partitions"),
            *[_s(r.get("stages_s", {}).get(s)) for s in stages],
        ]

    lines: list[str] = []
    for key, title in (
        ("rows", "One match per partition"),
        ("merged_rows", "Neighbouring matches merged (MergeCompositeFunctions)"),
    ):
        lines += _table(
            ["operators", "explain", "per operator", "partitions", *stages],
            rows_of(data.get(key, []), per_stage),
            title,
        )
    lines += _table(
        [
            "operators",
            "explain, placement by cost",
            "on an accelerator",
            "candidates",
            "costs",
            "search",
        ],
        rows_of(
            data.get("auto_rows", []),
            lambda r: [
                r.get("on_accelerator"),
                *[_s(r.get("auto_s", {}).get(s)) for s in ("candidates", "costs", "search")],
            ],
        ),
        "Placement by cost",
    )
    return lines


def _thread_spin(data: dict[str, Any]) -> list[str]:
    rows = []
    for name, configs in data.get("models", {}).items():
        for config, r in configs.items():
            spin, _, executor = config.partition(", ")
            rows.append(
                [
                    name,
                    spin.removeprefix("spin "),
                    executor,
                    _ms(r.get("median_ms")),
                    r.get("chosen", "-"),
                    f"{r.get('idle_cpu_s', 0):.3f} s",
                ]
            )
    return _table(
        ["model", "spin count", "executor", "latency", "ran on", "CPU after the last call"],
        rows,
        "Best round of each configuration",
    )


def _verify_cost(data: dict[str, Any]) -> list[str]:
    rows = [
        [
            name,
            _s(r.get("compile_s")),
            _s(r.get("compile_verify_s")),
            _s(r.get("verify_stage_s")),
            _pct(r.get("added_pct")),
            f"{r.get('verified', '-')} of {r.get('partitions', '-')}",
            _err(r.get("largest_error")),
        ]
        for name, r in data.get("models", {}).items()
    ]
    return _table(
        [
            "model",
            "compile",
            "compile with verify",
            "verify stage",
            "added",
            "partitions verified",
            "largest error",
        ],
        rows,
        "Medians",
    )


def _zoo(data: dict[str, Any]) -> list[str]:
    rows = []
    for name, r in data.get("models", {}).items():
        plain, bare, three = (
            r.get("plain_tvm", {}),
            r.get("umahub_no_plugins", {}),
            r.get("umahub_three_plugins", {}),
        )
        rows.append(
            [
                name,
                f"{_s(plain.get('compile_s'))} / {_ms(plain.get('run_ms'))}",
                f"{_s(bare.get('compile_s'))} / {_ms(bare.get('run_ms'))}",
                f"{_s(three.get('compile_s'))} / {_ms(three.get('run_ms'))}",
                f"{three.get('offloaded', '-')} of {three.get('operators', '-')}",
                _ms(r.get("torch_eager", {}).get("run_ms")),
                _err(three.get("max_error")),
            ]
        )
    return _table(
        [
            "model",
            "plain tvm.compile: compile / run",
            "umahub, no plugins",
            "umahub, three plugins",
            "operators on accelerators",
            "PyTorch eager",
            "largest error",
        ],
        rows,
        "Compile time and median latency",
    )


def _quantized(data: dict[str, Any]) -> list[str]:
    rows = []
    for name, r in data.get("models", {}).items():
        ort, int8, fp32 = r.get("ort_int8", {}), r.get("umahub_int8", {}), r.get("umahub_fp32", {})
        agree = r.get("int8_agreement", {})
        ratio = int8["ms"] / ort["ms"] if int8.get("ms") and ort.get("ms") else None
        gain = fp32["ms"] / int8["ms"] if int8.get("ms") and fp32.get("ms") else None
        rows.append(
            [
                name,
                _ms(ort.get("ms")),
                _ms(int8.get("ms")),
                _ms(fp32.get("ms")),
                _ratio(ratio),
                _ratio(gain),
                f"{agree.get('equal', '-')} / {agree.get('differ_by_1', '-')} / "
                f"{agree.get('differ_by_more', '-')}",
            ]
        )
    return _table(
        [
            "model",
            "ONNX Runtime int8",
            "umahub int8",
            "umahub float32",
            "umahub int8 / ORT int8",
            "umahub float32 / int8",
            "outputs equal / 1 step / more, against ORT",
        ],
        rows,
        "Median latency, the same QDQ model for both engines",
    )


def _onnx_suite(data: dict[str, Any]) -> list[str]:
    summary = data.get("summary", {})
    outcomes = summary.get("outcomes", {})
    kinds = sorted({k for o in outcomes.values() for k in o})
    rows = [[config, *[o.get(k, 0) for k in kinds]] for config, o in outcomes.items()]
    lines = []
    if "cases" in summary:
        lines += [f"{summary['cases']:,} node tests.", ""]
    if data.get("note"):
        lines += [_escape(data["note"]), ""]
    lines += _table(["configuration", *kinds], rows, "Outcomes")
    regressions = summary.get("regressions", {})
    if regressions:
        lines += [
            "Regressions against plain TVM: "
            + "; ".join(f"{c}: {len(r)}" for c, r in regressions.items())
            + ".",
            "",
        ]
    return lines


def _outside_models(data: dict[str, Any]) -> list[str]:
    rows = []
    for name, r in data.get("models", {}).items():
        plain, ours = r.get("plain", {}), r.get("umahub", {})
        ratio = r.get("umahub_over_plain")
        rows.append(
            [
                name,
                f"{_s(plain.get('compile_s'))} / {_ms(plain.get('run_ms'))}"
                if "error" not in plain
                else f"error: {plain['error']}",
                f"{_s(ours.get('compile_s'))} / {_ms(ours.get('run_ms'))}"
                if "error" not in ours
                else f"error: {ours['error']}",
                _ratio(ratio),
                f"{_err(plain.get('rel_error'))} / {_err(ours.get('rel_error'))}",
                f"{ours.get('offloaded', '-')} of {ours.get('operators', '-')}",
                ", ".join(ours.get("host_unscheduled", [])) or "none",
                "yes" if r.get("valid") else "no",
            ]
        )
    return _table(
        [
            "model",
            "plain tvm.compile: compile / run",
            "umahub (default settings): compile / run",
            "umahub / plain",
            "relative error against PyTorch: plain / umahub",
            "operators on accelerators",
            "host functions unscheduled",
            "valid",
        ],
        rows,
        "Compile time and median latency",
    )


def _host_operators(data: dict[str, Any]) -> list[str]:
    rows = []
    for name, r in data.get("operators", {}).items():
        plain, before, after = r.get("plain", {}), r.get("before", {}), r.get("after", {})

        def rules(way: dict) -> str:
            return ", ".join(f"{k} {v}" for k, v in way.get("rules", {}).items())

        rows.append(
            [
                name,
                _ms(plain.get("ms")),
                f"{_ms(before.get('ms'))} ({rules(before)})",
                f"{_ms(after.get('ms'))} ({rules(after)})",
                _err(after.get("rel_difference")),
            ]
        )
    return _table(
        [
            "operator",
            "plain tvm.compile",
            "umahub before (rules)",
            "umahub after (rules)",
            "after: relative difference from plain",
        ],
        rows,
        "Median latency of one operator on the host",
    )


def _host_functions(data: dict[str, Any]) -> list[str]:
    rows = []
    for name, r in data.get("models", {}).items():
        if "error" in r:
            rows.append([name, "-", f"error: {r['error']}", "-"])
            continue
        top = next((f for f in r.get("functions", []) if f.get("ms") is not None), None)
        rows.append(
            [
                name,
                _ms(r.get("host_ms")),
                ", ".join(f"{k} {_ms(v)}" for k, v in r.get("by_rule_ms", {}).items()),
                "-"
                if top is None
                else f"{top['name']} ({top['rule']}): {_ms(top['ms'])} x {top['calls']}",
            ]
        )
    return _table(
        ["model", "host functions, each alone", "by rule", "the longest"],
        rows,
        "The host's functions per outside model, each timed alone",
    )


def _generic(data: dict[str, Any]) -> list[str]:
    """A file of unknown shape: each table-like top-level entry, and the scalars."""
    lines: list[str] = []
    scalars = [
        [k, v] for k, v in data.items() if isinstance(v, (int, float, str)) and k not in ("when",)
    ]
    lines += _table(["what", "value"], scalars)
    for key, value in data.items():
        if key in ("machine", "meta", "versions") or not isinstance(value, dict):
            continue
        if all(isinstance(v, dict) for v in value.values()) and value:
            columns = [
                c
                for c in dict.fromkeys(c for v in value.values() for c in v)
                if all(isinstance(v.get(c), (int, float, str, type(None))) for v in value.values())
            ]
            if columns:
                rows = [
                    [
                        name,
                        *[
                            "-"
                            if v.get(c) is None
                            else (f"{v[c]:.4g}" if isinstance(v[c], float) else v[c])
                            for c in columns
                        ],
                    ]
                    for name, v in value.items()
                ]
                lines += _table([key, *columns], rows)
    return lines


def _executors(data: dict[str, Any]) -> list[str]:
    header = [
        "model",
        "machine",
        "VM",
        "concurrent",
        "auto",
        "auto chose",
        "auto / VM, paired",
        "noise",
        "verdict",
        "across processes",
    ]
    rows = []
    for name, row in data.get("models", {}).items():
        # "idle" and "busy", or each under a thread setting: "idle pool2"
        for condition, cell in row.items():
            if not condition.startswith(("idle", "busy")) or not cell:
                continue
            auto = cell.get("auto", {})
            # what runs, with its thread count: the why's head ("vm on one thread, chosen ...")
            chose = auto.get("why", "").split(",")[0].split(":")[0]
            paired, across = cell, cell.get("across_processes")
            if across is None and "verdict" in cell:  # a file from before the paired verdict
                paired, across = {}, cell
            rows.append(
                [
                    name,
                    condition,
                    *[_ms(cell.get(e, {}).get("median_ms")) for e in ("vm", "concurrent", "auto")],
                    chose or ", ".join(auto.get("chosen", [])) or "-",
                    _ratio(paired.get("auto_over_vm"), 3),
                    _pct(100 * paired["noise"]) if "noise" in paired else "-",
                    paired.get("verdict", "-"),
                    f"{_ratio(across['auto_over_vm'])}: {across['verdict']}" if across else "-",
                ]
            )
    return _table(
        header,
        rows,
        "Median latency of each executor, idle and beside a busy process (each in a process "
        "of its own); auto against the VM in the same processes (paired)",
    )


RENDERERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "executors": _executors,
    "engines_intel": _engines,
    "engines_amd": _engines,
    "engines_recheck": _engines,
    "language_models": _language_models,
    "auto": _auto,
    "concurrency": _concurrency,
    "compile_overhead": _compile_overhead,
    "npu_kernels": _npu_kernels,
    "plugin_loading": _plugin_loading,
    "remote_overhead": _remote_overhead,
    "scaling": _scaling,
    "thread_spin": _thread_spin,
    "verify_cost": _verify_cost,
    "zoo": _zoo,
    "quantized_intel": _quantized,
    "quantized_amd": _quantized,
    "outside_models_intel": _outside_models,
    "outside_models_amd": _outside_models,
    "host_operators": _host_operators,
    "host_functions": _host_functions,
    "onnx_suite": _onnx_suite,
    "onnx_suite_before": _onnx_suite,
}

#: The script that writes each results file, where its name is not the file's.
SCRIPTS = {
    "engines_intel": "benchmarks/engines.py",
    "engines_amd": "benchmarks/engines.py",
    "engines_recheck": "benchmarks/engines.py",
    "quantized_intel": "benchmarks/quantized.py",
    "quantized_amd": "benchmarks/quantized.py",
    "outside_models_intel": "benchmarks/outside_models.py",
    "outside_models_amd": "benchmarks/outside_models.py",
    "remote_overhead": "",  # measured by hand with ``umahub bench``: the file says how
    "onnx_suite": "src/umahub/testing/onnx_suite.py",
    "onnx_suite_before": "src/umahub/testing/onnx_suite.py",
}

#: Sections in this order; files not named here follow, by name.
ORDER = (
    "engines_intel",
    "engines_amd",
    "engines_recheck",
    "language_models",
    "zoo",
    "outside_models_intel",
    "outside_models_amd",
    "host_functions",
    "host_operators",
    "quantized_intel",
    "quantized_amd",
    "npu_kernels",
    "auto",
    "concurrency",
    "executors",
    "thread_spin",
    "compile_overhead",
    "verify_cost",
    "plugin_loading",
    "scaling",
    "remote_overhead",
    "onnx_suite",
    "onnx_suite_before",
)

TITLES = {
    "engines_intel": "umahub against PyTorch and ONNX Runtime: Intel Xeon",
    "engines_amd": "umahub against PyTorch and ONNX Runtime: AMD EPYC",
    "engines_recheck": "The smallest models again, more rounds (AMD EPYC)",
    "language_models": "Language models: prefill and decode against PyTorch and plain TVM",
    "zoo": "The zoo: plain TVM, umahub without and with plugins",
    "outside_models_intel": "Outside models: umahub's defaults against plain TVM (Intel Xeon)",
    "outside_models_amd": "Outside models: umahub's defaults against plain TVM (AMD EPYC)",
    "host_functions": "Outside models: the host's functions by schedule rule",
    "host_operators": "Host operators outside models use: before and after their rule",
    "quantized_intel": "int8 against ONNX Runtime and against float32: Intel Xeon",
    "quantized_amd": "int8 against ONNX Runtime and against float32: AMD EPYC",
    "npu_kernels": "The npu's schedules, kernel by kernel",
    "auto": "Placement by cost",
    "concurrency": "The VM against the concurrent executor",
    "executors": "The default executor against the VM, idle and beside a busy process",
    "thread_spin": "TVM's thread-pool spin count",
    "compile_overhead": "umahub's own compile time",
    "verify_cost": "What verify costs",
    "plugin_loading": "Plugin discovery and hook dispatch",
    "scaling": "Partition and placement as models grow",
    "remote_overhead": "Running on a board over RPC",
    "onnx_suite": "The ONNX node tests",
    "onnx_suite_before": "The ONNX node tests, an earlier run",
    "tuning": "Tuning the host's kernels with MetaSchedule",
}


def _script_docstring(script: Path) -> str:
    """The script's docstring, less the note for code readers on why it is long."""
    try:
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    except (OSError, SyntaxError):
        return ""
    paragraphs = doc.split("\n\n")
    return "\n\n".join(p for p in paragraphs if not p.startswith("Why this module is long:"))


def result_files() -> list[Path]:
    """Every results file, in the page's order."""
    found = {p.stem: p for d in RESULTS_DIRS if d.is_dir() for p in sorted(d.glob("*.json"))}
    named = [found.pop(n) for n in ORDER if n in found]
    return named + [found[n] for n in sorted(found)]


def section(path: Path, described: set[str] | None = None) -> list[str]:
    """One results file as a section: its tables, the machine and versions, how it was measured."""
    data = json.loads(path.read_text())
    name = path.stem
    title = TITLES.get(name, name.replace("_", " ").capitalize())
    rel = path.relative_to(ROOT).as_posix()
    lines = [title, "-" * len(title), "", f"From ``{rel}``.", ""]
    lines += RENDERERS.get(name, _generic)(data)
    settings = ("threads", "repeat", "rounds", "runs", "stream_length", "denormals", "note")
    recorded = _machine(data) + _settings({**data.get("meta", {}), **data}, settings)
    lines += _table(None, recorded, "Recorded with the results")
    script = SCRIPTS.get(name, f"benchmarks/{name}.py")
    doc = _script_docstring(ROOT / script) if script else ""
    if doc and described is not None and script in described:
        lines += [f"Measured by ``{script}``, as described above.", ""]
    elif doc:
        if described is not None:
            described.add(script)
        lines += [
            f".. admonition:: How it was measured (``{script}``)",
            "",
            *["   " + line if line else "" for line in doc.splitlines()],
            "",
        ]
    return lines


def render() -> str:
    """The generated part of the benchmarks page, as reStructuredText."""
    lines: list[str] = []
    described: set[str] = set()  # scripts whose docstring is on the page already
    for path in result_files():
        lines += section(path, described)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render())
