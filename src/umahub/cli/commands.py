"""The ``umahub`` command: ``plugins``, ``compile``, ``run``, ``explain``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError

__all__ = ["main"]


def _hub(args: argparse.Namespace) -> Any:
    from umahub.hub import Hub

    return Hub(strict=True if getattr(args, "strict", False) else None)


def cmd_plugins(args: argparse.Namespace) -> int:
    """List every plugin in its effective order, with what it brings or why it failed."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # failures are listed below, not warned twice
        hub = _hub(args)
    if args.json:
        data = {
            "config": hub.config.source,
            "plugins": [p.to_dict() for p in hub.plugins],
            "accelerators": [
                {
                    "name": a.name,
                    "plugin": hub.owner(a.name),
                    "codegen": a.codegen,
                    "instances": a.instances,
                    "memory": [vars(p) for p in a.memory],
                }
                for a in hub.accelerators
            ],
            "hook_order": {h: hub.call_order(h) for h in _hook_names()},
        }
        print(json.dumps(data, indent=2))
        return 0
    print(f"config: {hub.config.source}")
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
    if hub.accelerators:
        print("accelerators in claiming order:")
        claimants = {a.name for a in hub.claimants}
        for a in hub.accelerators:
            note = "" if a.name in claimants else "  (not in priority: claims nothing)"
            print(f"  {a.name:<16} {a.codegen:<5} x{a.instances}  from {hub.owner(a.name)}{note}")
    return 0


def _hook_names() -> tuple[str, ...]:
    from umahub.dispatch import HOOK_NAMES

    return HOOK_NAMES


def _load_model(spec: str) -> Any:
    from umahub.frontends import load_model

    return load_model(spec)


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile MODEL through the plugins and export it as one shared library."""
    mod = _load_model(args.model)  # a bad file fails before the plugins are loaded
    hub = _hub(args)
    compiled = hub.compile(mod, progress=_progress, verify=args.verify or None)
    compiled.export_library(args.output)
    print(compiled.report)
    print(f"wrote {args.output}")
    if args.report:
        Path(args.report).write_text(compiled.report.to_json())
        print(f"wrote {args.report}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run an exported library on random inputs or on the arrays of an .npz file."""
    import numpy as np

    from umahub.compiled import example_inputs, load

    model = load(args.library)
    if args.inputs:
        with np.load(args.inputs) as data:
            arrays = [data[k] for k in data.files]
    else:  # sizes known only at run time are 1
        arrays = example_inputs(model.input_info, seed=0)
    outputs = model.run(*arrays)
    for i, out in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        flat = np.asarray(out).ravel()
        print(
            f"output {i}: shape {tuple(np.shape(out))} dtype {np.asarray(out).dtype} "
            f"first {np.array2string(flat[:5], precision=4)}"
        )
    if args.output:
        np.savez(args.output, *(outputs if isinstance(outputs, (list, tuple)) else [outputs]))
        print(f"wrote {args.output}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Show placement, copies and memory of MODEL without building it."""
    if args.out:
        from umahub.picture import SUFFIXES

        if Path(args.out).suffix.lower() not in SUFFIXES:
            raise UmahubError(
                f"--out {args.out}: the picture is written as "
                f"{' or '.join(SUFFIXES)}; give a file name ending in one of them"
            )
    mod = _load_model(args.model)
    hub = _hub(args)
    report = hub.explain(mod)
    print(report)
    if args.out:
        report.save_picture(args.out)
        print(f"wrote {args.out}")
    return 0


def _progress(stage: str, detail: str = "") -> None:
    print(f"[umahub] {stage}{': ' + detail if detail else ''}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``umahub`` command."""
    parser = argparse.ArgumentParser(prog="umahub", description=__doc__)
    parser.add_argument(
        "--strict",
        action="store_true",
        help="a plugin that fails to load is an error, not a warning",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="what is installed, in what order, and what failed")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks of failures")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("compile", help="compile MODEL into a shared library")
    p.add_argument(
        "model",
        help="a model-zoo name, a TVMScript .py file, an .onnx file or a .pt2 file "
        "(torch.export.save)",
    )
    p.add_argument("-o", "--output", default="model.so", help="library to write")
    p.add_argument("--report", help="also write the report as JSON to this file")
    p.add_argument(
        "--verify",
        action="store_true",
        help="check every partition against the host on the model's own values "
        "(as verify = true in [tool.umahub])",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a library written by 'umahub compile'")
    p.add_argument("library")
    p.add_argument("--inputs", help=".npz file with the inputs, in order")
    p.add_argument("-o", "--output", help="write the outputs to this .npz file")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("explain", help="placement, copies and memory, without building")
    p.add_argument("model", help="what 'umahub compile' takes")
    p.add_argument("--out", help="save the picture (.svg or .html)")
    p.set_defaults(func=cmd_explain)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).removeprefix("umahub: ")
    print(f"umahub: warning: {text}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``umahub`` command; return its exit code."""
    import warnings

    warnings.showwarning = _show_warning
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UmahubError as exc:
        print(f"umahub: error: {exc}", file=sys.stderr)
        return 2
