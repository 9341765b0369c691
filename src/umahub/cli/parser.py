"""The ``umahub`` command's arguments: the subcommands, their options, the help texts.

Why this module is long: it is the command's whole surface, every subcommand's
options with their help, in one place a user's ``--help`` reads from; split by
subcommand, the options they share would be declared twice.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["build_parser"]

DESCRIPTION = """\
Accelerator backends for Apache TVM as installable plugins.

  umahub plugins               what is installed, in what order, what failed
  umahub explain MODEL         where each operator would run, without building
  umahub compile MODEL -o F    compile through the plugins into one library
  umahub run F                 run that library (no plugins needed)
  umahub bench F               its latency, here or on a board (--rpc)
  umahub tune MODEL            tune its kernels (MetaSchedule), here or on boards
  umahub new-plugin NAME       start a plugin: a package that passes its own tests

The configuration is [tool.umahub] in the nearest pyproject.toml (or the file
named by UMAHUB_CONFIG). Errors are one line and exit status 2; -v or
UMAHUB_DEBUG=1 adds the traceback.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line (status 2), as every error is."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """Options every subcommand takes, before or after its name.

    ``default`` is False on the main parser and SUPPRESS on the subcommands,
    so that an option given before the subcommand is not reset by it.
    """
    parser.add_argument(
        "--strict",
        action="store_true",
        default=default,
        help="a plugin that fails to load is an error, not a warning",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="tracebacks of errors and of plugins that failed to load",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="print only errors"
    )


MODEL_HELP = (
    "a zoo model ({zoo}), a TVMScript .py file, an .onnx file or a .pt2 file (torch.export.save)"
)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help texts with ``{zoo}`` replaced by the zoo's model names.

    Only ``--help`` pays for it: listing the zoo imports TVM, which is slow.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text and "{zoo}" in text:
            from umahub.models import names

            text = text.replace("{zoo}", ", ".join(names()))
        return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``umahub`` command."""
    from umahub.cli import commands

    parser = _Parser(prog="umahub", description=DESCRIPTION, formatter_class=_Formatter)
    _global_options(parser, False)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def add(name: str, help: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=help[0].upper() + help[1:] + ".",
            formatter_class=_Formatter,
        )
        _global_options(p, argparse.SUPPRESS)
        p.set_defaults(func=func)
        return p

    p = add("plugins", "what is installed, in what order, and what failed", commands.cmd_plugins)
    p.add_argument("--json", action="store_true", help="print JSON")
    _backend_option(p)

    p = add("compile", "compile MODEL into a shared library", commands.cmd_compile)
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("-o", "--output", default="model.so", help="library to write (model.so)")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="the full report: '-' prints it, a file name gets it as JSON "
        "(by default a summary is printed)",
    )
    p.add_argument(
        "--report-format",
        choices=("text", "json"),
        help="how --report - prints it: text (the default) or JSON alone on stdout",
    )
    p.add_argument(
        "--auto",
        action="store_true",
        help="place by cost: each group of operators where the whole model runs fastest, "
        'costs measured (and cached) or from the plugins (as priority = "auto")',
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="check every partition against the host on the model's own values "
        "(as verify = true in [tool.umahub])",
    )
    p.add_argument(
        "--target",
        metavar="TARGET",
        help='build for another machine: an LLVM target, e.g. "llvm -mtriple=aarch64-linux-gnu" '
        "(as target in [tool.umahub]; default: this machine); needs --cc",
    )
    p.add_argument(
        "--cc",
        metavar="COMPILER",
        help="the C compiler that compiles and links the library, e.g. aarch64-linux-gnu-gcc "
        "for --target (as cc in [tool.umahub])",
    )

    _board_options(p, "with --auto, time the candidate groups")
    _on_error_option(p)
    _backend_option(p)
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the build, time the VM and the concurrent executor on random inputs and "
        "put the measured run in the report and its picture (as profile = true)",
    )

    p = add("run", "run a library written by 'umahub compile'", commands.cmd_run)
    p.add_argument("library")
    p.add_argument(
        "--inputs",
        metavar="FILE",
        help="the inputs: an .npz file (in order) or, for a model of one input, an .npy "
        "file; random inputs when not given",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the outputs to this .npz file")
    p.add_argument(
        "--repeat",
        type=_positive,
        default=1,
        metavar="N",
        help="run N times after warming up (one run, more while the auto executor is "
        "choosing) and print the latency's min, median and max (default: time the one run)",
    )
    p.add_argument(
        "--executor",
        choices=("auto", "vm", "concurrent"),
        help="how the model runs here: TVM's VM one step after the other, the concurrent "
        "executor (a worker per device), or auto (the faster of the two; the default)",
    )
    p.add_argument(
        "--stream",
        type=_positive,
        metavar="N",
        help="then run N inferences as a stream (several in flight, one per pipeline stage) "
        "and print the throughput",
    )

    _board_options(p)

    p = add("bench", "measure the latency of a library, here or on a board", commands.cmd_bench)
    p.add_argument(
        "library",
        help="a library (umahub compile -o), or a decoder's directory "
        "(CompiledDecoder.export_library): its prefill time and decode tokens per second",
    )
    p.add_argument(
        "--inputs", metavar="FILE", help="the inputs (.npz or .npy); random when not given"
    )
    p.add_argument(
        "--repeat",
        type=_positive,
        default=None,
        metavar="N",
        help="timed runs (default: 50); for a decoder, rounds of a prefill and its decode "
        "steps (default: 5)",
    )
    p.add_argument(
        "--prompt-tokens",
        type=_positive,
        default=128,
        metavar="N",
        help="a decoder's prompt length (default: 128, less if the cache holds fewer)",
    )
    p.add_argument(
        "--new-tokens",
        type=_positive,
        default=32,
        metavar="N",
        help="a decoder's decode steps per round (default: 32)",
    )
    p.add_argument(
        "--warmup",
        type=_positive,
        default=1,
        metavar="N",
        help="untimed runs first, more while the auto executor is choosing (default: 1)",
    )
    p.add_argument("--json", metavar="FILE", help="write the numbers as JSON ('-' prints them)")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write the profiled runs as a Chrome trace (JSON for Perfetto or chrome://tracing): "
        "a track per device and per DMA lane, copies included (a run here, on the "
        "concurrent executor)",
    )
    _board_options(p)

    from umahub.cli.tune import cmd_tune

    p = add(
        "tune",
        "tune the kernels of MODEL (the host's, and the accelerators' whose plugins offer a "
        "search space) with TVM's MetaSchedule into a database that "
        "compile uses where a tuned kernel measured faster",
        cmd_tune,
    )
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument(
        "--database",
        metavar="DIR",
        help="the tuning database to write (default: tuning-database in [tool.umahub])",
    )
    p.add_argument(
        "--trials",
        type=_positive,
        default=64,
        metavar="N",
        help="candidate schedules measured in all, shared among the kernels by how often "
        "each runs (default: 64)",
    )
    p.add_argument(
        "--rpc",
        metavar="HOST:PORT",
        help="measure on the boards of this TVM tracker, every free board of --key at once",
    )
    p.add_argument("--key", help="the kind of board to measure on (with --rpc)")
    _backend_option(p)

    p = add("explain", "placement, copies and memory, without building", commands.cmd_explain)
    p.add_argument("model", help=MODEL_HELP)
    _board_options(p, "with --auto, time the candidate groups")
    p.add_argument(
        "--auto",
        action="store_true",
        help="place by cost, each group of operators where the whole model runs fastest "
        "(the groups alone are built to time them; the model is not built)",
    )
    p.add_argument("--out", metavar="FILE", help="save the picture (.svg or .html)")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="write the report as JSON ('-' prints it alone, instead of the text)",
    )
    _on_error_option(p)
    _backend_option(p)

    p = add(
        "new-plugin",
        "write a plugin package that works as it is: one pattern, the other hooks "
        "stubbed with their contracts, tests that run the conformance kit, a tox matrix",
        commands.cmd_new_plugin,
    )
    p.add_argument(
        "name",
        metavar="NAME",
        help="the package's distribution name (my-accel); its Python package is my_accel",
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="where to create the package directory NAME (and NAME-runtime with --device); "
        "default: the current directory. A directory that exists must be empty",
    )
    p.add_argument(
        "--accelerator",
        metavar="ACC",
        help="the accelerator's name (default: the Python package's, without 'umahub_')",
    )
    p.add_argument(
        "--device",
        action="store_true",
        help="an accelerator with a device of its own: also a runtime package NAME-runtime "
        "whose device is simulated in Python",
    )
    return parser


def _on_error_option(p: argparse.ArgumentParser) -> None:
    """``--on-error``: what a plugin's failure does (as on-error in [tool.umahub])."""
    p.add_argument(
        "--on-error",
        choices=("fallback", "error"),
        help="a plugin that fails: its operators go to the host with a warning (fallback), "
        "or the command stops (error); as on-error in [tool.umahub], whose value it overrides",
    )


def _backend_option(p: argparse.ArgumentParser) -> None:
    """``--option ACC.KEY=VALUE``: a backend option (as [tool.umahub.options.ACC] KEY)."""
    p.add_argument(
        "--option",
        action="append",
        type=_option,
        default=[],
        metavar="ACC.KEY=VALUE",
        dest="options",
        help="set an option of accelerator ACC (umahub plugins lists them), read as the "
        "option's type (true/false, a number, a string); repeatable; as KEY = VALUE in "
        "[tool.umahub.options.ACC], whose value it overrides",
    )


def _option(text: str) -> tuple[str, str, str]:
    from umahub.config import parse_option
    from umahub.errors import ConfigError

    try:
        return parse_option(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--option {text}: ")) from None


def _board_options(p: argparse.ArgumentParser, doing: str = "run") -> None:
    """``--rpc``/``--rpc-server``/``--key``/``--timeout``: a board over TVM's RPC.

    ``doing``: what the board is for, in the help (``"run"``; compile and
    explain time the candidate groups of ``--auto`` on it).
    """
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--rpc",
        metavar="HOST:PORT",
        help=f"{doing} on a board from this TVM tracker (python -m tvm.exec.rpc_tracker); "
        "with --key",
    )
    where.add_argument(
        "--rpc-server",
        metavar="HOST:PORT",
        help=f"{doing} on this one board (python -m umahub.boards.board), no tracker",
    )
    p.add_argument("--key", help="the kind of board to ask the tracker for")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="seconds to wait for the tracker, a free board, or one call on it (default: 60)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


class _Version(argparse.Action):
    """``--version``: umahub's, TVM's, Python's and the plugins' versions, then exit."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="versions of umahub, TVM, Python and the installed plugins",
        )

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from umahub.cli.version import version_text

        print(version_text())
        parser.exit()
