"""The subcommands of ``umahub``: each a function of its parsed arguments, returning the exit code.

Everything a command will write is checked before its long work starts: a
compile must not run for minutes and then fail on ``-o`` in a missing directory.

Why this module is long: it is the table of the command line, one short
handler per subcommand, each calling into the library; what they share (the
hub from the flags, the board, the model) is here once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from umahub.cli.files import check_writable, read_inputs
from umahub.cli.progress import Progress
from umahub.cli.summary import accelerator_lines, summary
from umahub.errors import ConfigError, UmahubError

__all__ = [
    "cmd_bench",
    "cmd_compile",
    "cmd_explain",
    "cmd_new_plugin",
    "cmd_plugins",
    "cmd_run",
]


def _hub(args: argparse.Namespace, project_config: bool = True) -> Any:
    from umahub.hub.hub import Hub

    config: dict[str, Any] = {}
    on_error = getattr(args, "on_error", None)
    if on_error:
        config["on-error"] = on_error
    options: dict[str, dict[str, str]] = {}
    for accelerator, key, value in getattr(args, "options", ()):  # --option: the last one wins
        options.setdefault(accelerator, {})[key] = value
    if options:
        config["options"] = options
    strict = True if getattr(args, "strict", False) else None
    return Hub(config=config or None, strict=strict, project_config=project_config)


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text)


def _entry_points(group: str = "tvm.backends") -> list[dict[str, str]]:
    """The entry points of ``group``: TVM's own plugin group (which ``import tvm``
    calls) by default, or umahub's device runtimes'."""
    from importlib import metadata as importlib_metadata

    found = []
    for ep in sorted(importlib_metadata.entry_points(group=group), key=lambda e: e.name):
        dist = ep.dist
        found.append(
            {
                "name": ep.name,
                "value": ep.value,
                "distribution": dist.name if dist is not None else "",
                "version": dist.version if dist is not None else "",
            }
        )
    return found


def cmd_plugins(args: argparse.Namespace) -> int:
    """List every plugin in its effective order, with what it brings or why it failed."""
    import warnings

    from umahub.plugin.accelerator import unknown_operators
    from umahub.plugin.device import RUNTIME_ENTRY_POINTS

    wrong = None  # the project's configuration, when it is wrong: listed without it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # failures are listed below, not warned twice
        try:
            hub = _hub(args)
        except ConfigError as exc:
            wrong = exc
            hub = _hub(args, project_config=False)
    source = f"not used, it is wrong: {wrong}" if wrong else hub.config.source
    if args.json:
        data = {
            "config": source,
            "plugins": [p.to_dict() for p in hub.plugins],
            "accelerators": [
                {
                    "name": a.name,
                    "plugin": hub.owner(a.name),
                    "codegen": a.codegen,
                    "instances": a.instances,
                    "memory": [vars(p) for p in a.memory],
                    "buffers": [vars(b) for b in a.buffers],
                    "clock_hz": a.clock_hz,
                    "description": a.description,
                    "operators": list(a.operators),
                    "runtime": a.runtime,
                    "runtime_package": a.package,
                    "options": [
                        {
                            "name": o.name,
                            "type": o.type.__name__,
                            "default": o.default,
                            "value": hub.options_of(a.name)[o.name],
                            "help": o.help,
                            "choices": list(o.choices) if o.choices is not None else None,
                        }
                        for o in a.options
                    ],
                }
                for a in hub.accelerators
            ],
            "hook_order": {h: hub.call_order(h) for h in _hook_names()},
            "runtimes": _entry_points(RUNTIME_ENTRY_POINTS),
            "tvm_backends": _entry_points(),
        }
        print(json.dumps(data, indent=2))
        return _listed(wrong)
    print(f"config: {source}")
    if not hub.plugins:
        print(
            "no plugins found (pip install one that declares an entry point in "
            "the group 'umahub.plugins')"
        )
    for i, p in enumerate(hub.plugins, 1):
        dist = f"{p.distribution} {p.version}" if p.distribution else p.origin
        api = p.api_version if p.api_version is not None else "-"
        status = "ok" if p.loaded else "FAILED"
        print(f"{i:>2}. {p.name:<16} {status:<6} {dist}  (API {api})")
        if p.loaded:
            print(f"      accelerators: {', '.join(p.accelerators) or '-'}")
            print(f"      hooks:        {', '.join(h.removeprefix('umahub_') for h in p.hooks)}")
        else:
            print(f"      error: {p.error}")
            if args.verbose and p.traceback:
                print("      " + p.traceback.replace("\n", "\n      "))
    runtimes = _entry_points(RUNTIME_ENTRY_POINTS)
    if hub.accelerators:
        print("accelerators in claiming order:")
        claimants = {a.name for a in hub.claimants}
        for a in hub.accelerators:
            note = "" if a.name in claimants else "  (not in priority: claims nothing)"
            print(f"  {a.name:<16} {a.codegen:<6} x{a.instances}  from {hub.owner(a.name)}{note}")
            if a.description:
                print(f"      {a.description}")
            if a.operators:
                print(f"      operators: {', '.join(a.operators)}")
                for problem in unknown_operators(a):
                    print(f"      error: {problem}")
            for line in accelerator_lines(a):
                print(f"      {line}")
            if a.runtime:
                installed = a.runtime in {r["name"] for r in runtimes}
                state = "installed" if installed else f"NOT installed: pip install {a.package}"
                print(f"      device runtime: {a.runtime} ({state})")
            for line in _option_lines(a, hub.options_of(a.name)):
                print(f"      {line}")
    if runtimes:
        print(f"device runtimes (group {RUNTIME_ENTRY_POINTS}):")
        for r in runtimes:
            print(f"  {r['name']:<16} {r['value']}  ({r['distribution']} {r['version']})")
    backends = _entry_points()
    if backends:
        print("TVM backends (group tvm.backends, called by TVM itself at 'import tvm'):")
        for b in backends:
            print(f"  {b['name']:<16} {b['value']}  ({b['distribution']} {b['version']})")
    return _listed(wrong)


def _listed(wrong: ConfigError | None) -> int:
    """``umahub plugins``' status once listed: 0, or the project's configuration error
    (one line on stderr, exit status 2), after the plugins as installed."""
    if wrong is not None:
        raise wrong
    return 0


def _option_lines(accelerator: Any, values: Any) -> list[str]:
    """``umahub plugins``' lines on an accelerator's options: name, type, default, help,
    and the value set where it is not the default."""
    from umahub.plugin.options import format_value

    if not accelerator.options:
        return []
    width = max(len(o.name) for o in accelerator.options)
    defaults = [format_value(o.default) for o in accelerator.options]
    shown = max(len(d) for d in defaults)
    lines = [f"options ([tool.umahub.options.{accelerator.name}], --option):"]
    for o, default in zip(accelerator.options, defaults):
        value = values[o.name]
        said = [o.help] if o.help else []
        if o.choices is not None:
            said.append("one of " + ", ".join(format_value(c) for c in o.choices))
        if value != o.default:
            said.append(f"set to {format_value(value)}")
        line = f"  {o.name:<{width}}  {o.type.__name__:<5}  default {default:<{shown}}"
        lines.append(f"{line}  {'; '.join(said)}".rstrip())
    return lines


def _hook_names() -> tuple[str, ...]:
    from umahub.hub.dispatch import HOOK_NAMES

    return HOOK_NAMES


def _load_model(spec: str, progress: Progress) -> Any:
    from umahub.frontends import load_model

    with progress.step("import", spec):
        return load_model(spec)


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile MODEL through the plugins and export it as one shared library."""
    check_writable(args.output, "-o")
    if args.report_format and args.report != "-":
        raise UmahubError(
            "--report-format says how --report - prints the report: give --report - too "
            "(a --report FILE is always JSON)"
        )
    if args.report and args.report != "-":
        check_writable(args.report, "--report")
    progress = Progress(quiet=args.quiet)
    hub = _hub(args)  # a configuration error comes before any progress line
    target = _target(hub, args)  # so does a wrong target or a missing compiler
    with _cost_board(args) as board:
        mod = _load_model(args.model, progress)
        compiled = hub.compile(
            mod,
            model=Path(args.model).name,
            progress=progress,
            verify=args.verify or None,
            target=target,
            profile=args.profile or None,
            placement="auto" if args.auto else None,
            board=board,
        )
    with progress.step("export", f"{args.output} (compile and link)"):
        compiled.export_library(args.output)
    report = compiled.report
    as_json = args.report == "-" and args.report_format == "json"
    if as_json:
        print(report.to_json())  # JSON alone on stdout, for scripts
    elif args.report == "-":
        print(report)
    else:
        _say(args, summary(report, progress.elapsed()))
    if not as_json:
        _say(args, f"wrote {args.output}")
    if target is not None and not target.native and not as_json:
        _say(
            args,
            f"run it on a board ({target.arch}): umahub run {args.output} "
            "--rpc HOST:PORT --key KEY",
        )
    if args.report and args.report != "-":
        Path(args.report).write_text(report.to_json())
        _say(args, f"wrote {args.report}")
    return 0


def _target(hub: Any, args: argparse.Namespace) -> Any:
    """``--target``/``--cc`` (or the config's), checked; None: build for this machine."""
    from umahub.compiler.pipeline import check_target

    target = check_target(
        hub,
        args.target,
        args.cc,
        verify=args.verify or None,
        names={"target": "--target", "cc": "--cc", "verify": "--verify"},
    )
    if target is not None and not target.native:
        _say(args, f"building for {target.arch} ({target.text}), compiled by {target.cc}")
    return target


def cmd_run(args: argparse.Namespace) -> int:
    """Run an exported library on random inputs or on the arrays of an .npz/.npy file."""
    import numpy as np

    from umahub.runtime.compiled import example_inputs

    if args.output:
        check_writable(args.output, "-o")
    remote = bool(args.rpc or args.rpc_server)
    if remote and (args.executor or args.stream):
        option = "--executor" if args.executor else "--stream"
        raise UmahubError(f"{option} is for a run here; a board runs the model on TVM's VM")
    arrays = read_inputs(args.inputs) if args.inputs else None
    model = _model(args)
    if arrays is None:  # sizes known only at run time are 1
        arrays = example_inputs(model.input_info, seed=0)
    options = {} if remote else {"executor": args.executor}
    start = time.perf_counter()
    outputs = model.run(*arrays, **options)
    first = time.perf_counter() - start
    times, warm = [], 1
    if args.repeat > 1:
        if not remote:  # under "auto", time only once the executor is chosen
            warm += model.warm_up(*arrays, at_least=0, **options)
        for _ in range(args.repeat):
            start = time.perf_counter()
            model.run(*arrays, **options)
            times.append(time.perf_counter() - start)
    listed = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for i, out in enumerate(listed):
        flat = np.asarray(out).ravel()
        _say(
            args,
            f"output {i}: shape {tuple(np.shape(out))} dtype {np.asarray(out).dtype} "
            f"first {np.array2string(flat[:5], precision=4)}",
        )
    if times:
        ms = sorted(t * 1e3 for t in times)
        _say(
            args,
            f"latency: median {ms[len(ms) // 2]:.3f} ms, min {ms[0]:.3f} ms, "
            f"max {ms[-1]:.3f} ms over {len(ms)} runs after "
            + ("one warm-up run" if warm == 1 else f"{warm} warm-up runs"),
        )
    else:
        _say(args, f"latency: {first * 1e3:.3f} ms (the first run; --repeat N for a median)")
    if not remote:
        _say(args, f"executor: {model.executor_why(args.executor)}")
    if args.stream:
        start = time.perf_counter()
        for _ in model.stream((arrays for _ in range(args.stream)), executor=args.executor):
            pass
        seconds = time.perf_counter() - start
        _say(
            args,
            f"stream: {args.stream} inferences in {seconds:.3f} s, "
            f"{args.stream / seconds:.1f}/s (executor {args.executor or model.executor_in_use})",
        )
    if args.output:
        np.savez(args.output, *listed)
        _say(args, f"wrote {args.output}")
    return 0


@contextlib.contextmanager
def _cost_board(args: argparse.Namespace) -> Iterator[Any]:
    """The board ``--auto`` times its groups on (None without ``--rpc``), closed at the end."""
    board = _board(args)
    try:
        yield board
    finally:
        if board is not None:
            board.close()


def _board(args: argparse.Namespace, auto: bool = True) -> Any:
    """The board that ``--rpc``/``--rpc-server`` name (connected), or None.

    ``auto``: whether the command uses a board only to time ``--auto``'s groups.
    """
    if not (args.rpc or args.rpc_server):
        if args.key:
            raise UmahubError("--key names the boards to ask a tracker for: give --rpc HOST:PORT")
        return None
    option = "--rpc" if args.rpc else "--rpc-server"
    if auto and not args.auto:
        raise UmahubError(
            f"{option} with {args.command}: the board times the candidate groups of placement "
            "by cost; give --auto too (to run a library on a board: umahub run LIBRARY --rpc ...)"
        )
    if args.rpc and not args.key:
        raise UmahubError(f"--rpc {args.rpc}: give --key, the kind of board to ask the tracker for")
    from umahub.boards.rpc import connect

    board = connect(tracker=args.rpc, server=args.rpc_server, key=args.key, timeout=args.timeout)
    json_alone = getattr(args, "json", None) == "-" or (
        getattr(args, "report", None) == "-" and getattr(args, "report_format", None) == "json"
    )
    if not json_alone:  # --json - or --report - in JSON: the JSON alone on stdout
        _say(args, f"on {board.name} ({board.info.get('machine', '?')})")
    return board


def _model(args: argparse.Namespace) -> Any:
    """The library loaded here, or on the board that ``--rpc``/``--rpc-server`` name."""
    import os

    from umahub.runtime.compiled import load

    if not (args.rpc or args.rpc_server):
        _board(args, auto=False)  # --key alone is an error
        return load(args.library)
    if args.rpc and not args.key:
        raise UmahubError(f"--rpc {args.rpc}: give --key, the kind of board to ask the tracker for")
    if not os.path.isfile(args.library):
        raise UmahubError(f"{args.library}: no such file")
    return _board(args, auto=False).load(args.library)


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure the latency of an exported library, here or on a board."""
    from umahub.boards.bench import bench
    from umahub.runtime.compiled import example_inputs
    from umahub.runtime.generation import is_decoder_library

    if args.json and args.json != "-":
        check_writable(args.json, "--json")
    if is_decoder_library(args.library):
        return _bench_decoder(args)
    if args.trace:
        check_writable(args.trace, "--trace")
    args.repeat = args.repeat or 50
    arrays = read_inputs(args.inputs) if args.inputs else None
    model = _model(args)
    if arrays is None:
        arrays = example_inputs(model.input_info, seed=0)
    bar = _Bar(quiet=args.quiet)
    try:
        result = bench(
            model, arrays, repeat=args.repeat, warmup=args.warmup, progress=bar, trace=args.trace
        )
    finally:
        bar.done()
        if hasattr(model, "board"):
            model.board.close()
    if args.json == "-":  # JSON alone on stdout, for scripts
        print(json.dumps(result, indent=2))
        return 0
    ms = result["latency_ms"]
    _say(
        args,
        f"latency on {result['where']}: median {ms['median']:.3f} ms, min {ms['min']:.3f}, "
        f"p90 {ms['p90']:.3f}, max {ms['max']:.3f} over {result['repeat']} runs",
    )
    if "board_latency_ms" in result:
        on = result["board_latency_ms"]
        _say(args, f"main on the board alone: median {on['median']:.3f} ms, min {on['min']:.3f}")
    if "executor" in result:
        _say(args, f"executor: {result['executor']['why']}")
    for device, busy in result.get("device_ms", {}).items():
        _say(args, f"  {device}: {busy:.3f} ms busy")
    if result.get("device_ms_why"):
        _say(args, f"per-device time: not measured ({result['device_ms_why']})")
    if args.trace:
        _say(args, f"wrote {args.trace} (open it in https://ui.perfetto.dev)")
    text = json.dumps(result, indent=2)
    if args.json == "-":
        print(text)
    elif args.json:
        Path(args.json).write_text(text + "\n")
        _say(args, f"wrote {args.json}")
    return 0


def _bench_decoder(args: argparse.Namespace) -> int:
    """``umahub bench`` of a decoder's directory: prefill time and decode tokens per second."""
    from umahub.boards.bench import machine_info
    from umahub.runtime.generation import load_decoder, time_decoder

    given = [
        o for o, v in (("--rpc", args.rpc), ("--trace", args.trace), ("--inputs", args.inputs)) if v
    ]
    if given:
        raise UmahubError(
            f"{args.library} is a decoder (prefill and decode step): {given[0]} is for a "
            "library; a decoder is timed here, on random prompts"
        )
    decoder = load_decoder(args.library)
    result = {
        "model": str(args.library),
        "where": "this machine",
        **time_decoder(decoder, args.prompt_tokens, args.new_tokens, repeat=args.repeat or 5),
        "repeat": args.repeat or 5,
        "machine": machine_info(),
    }
    text = json.dumps(result, indent=2)
    if args.json == "-":
        print(text)
        return 0
    _say(
        args,
        f"prefill of {result['prompt_tokens']} tokens: median {result['prefill_ms']:.3f} ms "
        f"({result['prefill_tokens_per_s']:.1f} tokens/s)",
    )
    _say(
        args,
        f"decode: median {result['decode_ms']:.3f} ms per token, "
        f"{result['decode_tokens_per_s']:.1f} tokens/s ({result['new_tokens']} tokens, "
        f"{result['repeat']} rounds)",
    )
    if args.json:
        Path(args.json).write_text(text + "\n")
        _say(args, f"wrote {args.json}")
    return 0


class _Bar:
    """``bench 37/50`` on stderr: redrawn in place on a terminal, every tenth elsewhere."""

    def __init__(self, quiet: bool):
        import sys

        self.quiet, self.stream = quiet, sys.stderr
        self.live = self.stream.isatty()
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.quiet:
            return
        width = 30
        filled = width * done // total
        text = (
            f"[umahub {time.perf_counter() - self.start:5.1f}s] bench "
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        )
        if self.live:
            print("\r" + text, end="", file=self.stream, flush=True)
        elif done == total or done % max(1, total // 10) == 0:
            print(text, file=self.stream, flush=True)

    def done(self) -> None:
        if self.live and not self.quiet:
            print(file=self.stream, flush=True)


def cmd_explain(args: argparse.Namespace) -> int:
    """Show placement, copies and memory of MODEL without building it."""
    if args.json and args.json != "-":
        check_writable(args.json, "--json")
    if args.out:
        from umahub.report.picture import SUFFIXES

        if Path(args.out).suffix.lower() not in SUFFIXES:
            raise UmahubError(
                f"--out {args.out}: the picture is written as "
                f"{' or '.join(SUFFIXES)}; give a file name ending in one of them"
            )
        check_writable(args.out, "--out")
    progress = Progress(quiet=args.quiet)
    hub = _hub(args)
    with _cost_board(args) as board:
        mod = _load_model(args.model, progress)
        report = hub.explain(
            mod,
            model=Path(args.model).name,
            progress=progress,
            placement="auto" if args.auto else None,
            board=board,
        )
    if args.json == "-":
        print(report.to_json())  # JSON alone on stdout, for scripts
    else:
        _say(args, str(report))
    if args.json and args.json != "-":
        Path(args.json).write_text(report.to_json() + "\n")
        _say(args, f"wrote {args.json}")
    if args.out:
        report.save_picture(args.out)
        if args.json != "-":
            _say(args, f"wrote {args.out}")
    return 0


def cmd_new_plugin(args: argparse.Namespace) -> int:
    """Write a plugin package (and with ``--device`` its runtime's) that passes its own tests."""
    from umahub.cli.scaffold import next_steps, plan, write

    scaffold = plan(args.name, args.dir, args.accelerator, args.device)
    write(scaffold)
    _say(args, next_steps(scaffold))
    return 0
