"""``umahub tune MODEL``: its kernels tuned into the tuning database, one line each."""

from __future__ import annotations

import argparse

from umahub.cli.progress import Progress

__all__ = ["cmd_tune"]


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune MODEL's host kernels (:meth:`umahub.Hub.tune`) and print each kernel's verdict."""
    from umahub.cli.commands import _hub, _load_model, _say
    from umahub.tuning.tune import check_database

    progress = Progress(quiet=args.quiet)
    hub = _hub(args)
    database = check_database(args.database or hub.config.tuning_database)
    if args.rpc or args.key:  # the farm before the model: an unreachable one fails at once
        from umahub.tuning.runners import check_farm

        check_farm(args.rpc, args.key)
    mod = _load_model(args.model, progress)
    result = hub.tune(
        mod,
        database=str(database),
        trials=args.trials,
        rpc=args.rpc,
        key=args.key,
        progress=progress,
    )
    for line in result.lines():
        _say(args, line)
    if args.database and args.database != hub.config.tuning_database:
        _say(args, f'compile with it: tuning-database = "{args.database}" in [tool.umahub]')
    return 0
