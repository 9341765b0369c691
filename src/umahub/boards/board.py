"""The board side of a remote run: TVM's RPC server with umahub's loader in it.

A board runs TVM's own RPC server (``tvm.rpc.Server``: TVM's transport, its
tracker protocol, its upload and its session per client), started by
``python -m umahub.boards.board`` so that two functions are registered in it:

``umahub.board.load(name, devices, weights)``
    loads an uploaded library (``name`` in the session's work directory) on a
    Relax VM over ``devices`` virtual devices (host = 0, then each accelerator
    instance; their runtime devices as :func:`umahub.load` gives them,
    :func:`umahub.runtime.running.runtime_devices`), copies the weights that go
    to accelerators to their devices once (``weights``: JSON, the device index
    of each, as the library's trailer lists them), loads the programs of
    partitions on devices of their own through the runtime packages installed on the board
    (:mod:`umahub.runtime.devices`), and returns a function that runs ``main``
    on inputs uploaded to the board and returns its outputs.
``umahub.board.info()``
    the board's machine and versions, as JSON.

Why not TVM's plain server: its VM takes inputs over RPC through
``set_input``, which copies every argument to the first device, and a tensor
crossing the wire is never an owned tensor that ``main`` could take directly;
the weights that live on accelerator devices could not stay there. Here the
VM runs inside the board's process, exactly as :func:`umahub.load` runs it.

Every RPC session is a process of its own (TVM's server forks one per client),
so the state kept here is one session's.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["INFO", "LAST_SECONDS", "LOAD", "main", "register"]

#: The registered functions' names: what a client asks a board's server for over the
#: wire, kept as they were when the module was ``umahub.board`` so that boards and
#: clients of different umahub versions still understand each other.
LOAD = "umahub.board.load"
INFO = "umahub.board.info"
LAST_SECONDS = "umahub.board.last_seconds"

_last = [0.0]  # seconds of the last run's main on the board (this session's process)


def _load(name: str, devices: int, weights: str) -> Any:
    import tvm_ffi

    from umahub.runtime.compiled import _device_calls, _read_metadata, one_memory, open_library
    from umahub.runtime.running import Runner

    path = tvm_ffi.get_global_func("tvm.rpc.server.workpath")(name)
    # partitions on devices of their own: their programs are in the library's trailer,
    # run by the runtime packages installed on this board
    meta = _read_metadata(path)
    calls = _device_calls(path, meta)
    runner = Runner(
        open_library(path),
        int(devices),
        json.loads(weights),
        calls,
        "this library",
        one_memory(meta),
    )
    main = runner.vm()["main"]
    host = runner.devices[0]

    def run(*inputs: Any) -> Any:
        # Inputs arrive as views of the uploaded buffers: main takes owned tensors.
        owned = [x.copyto(host) for x in inputs]
        start = time.perf_counter()
        out = main(*owned, *runner.weights)
        _last[0] = time.perf_counter() - start
        return out

    return tvm_ffi.convert(run)


def register() -> None:
    """Register umahub's functions in this process (TVM's ``server_init_callback``)."""
    import tvm_ffi

    tvm_ffi.register_global_func(LOAD, _load, override=True)
    from umahub.boards.bench import machine_info

    tvm_ffi.register_global_func(INFO, lambda: json.dumps(machine_info()), override=True)
    tvm_ffi.register_global_func(LAST_SECONDS, lambda: _last[0], override=True)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m umahub.boards.board``: serve this board through TVM's RPC server."""
    parser = argparse.ArgumentParser(
        prog="python -m umahub.boards.board",
        description="Serve this board to umahub over TVM's RPC (TVM's server, with umahub's "
        "loader registered). Plugins are not needed on the board.",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    parser.add_argument("--port", type=int, default=9090, help="first port to try (9090)")
    parser.add_argument("--port-end", type=int, default=9199, help="last port to try (9199)")
    parser.add_argument("--tracker", type=_address, help="the tracker, HOST:PORT")
    parser.add_argument("--key", default="", help="the board's key at the tracker (its kind)")
    parser.add_argument(
        "--custom-addr", help="the address the tracker gives clients (default: as it sees it)"
    )
    args = parser.parse_args(argv)
    if args.tracker and not args.key:
        parser.error("--tracker needs --key: the kind of board this is (say 'rk3588')")
    from tvm import rpc

    server = rpc.Server(
        host=args.host,
        port=args.port,
        port_end=args.port_end + 1,
        tracker_addr=args.tracker,
        key=args.key,
        custom_addr=args.custom_addr,
        server_init_callback=register,
    )
    where = ""
    if args.tracker:
        where = f", key {args.key!r} at tracker {args.tracker[0]}:{args.tracker[1]}"
    print(f"umahub board: serving on {args.host}:{server.port}{where}", flush=True)
    # TVM's server runs in a process of its own, which outlives this one unless it is
    # stopped: a board stopped by SIGTERM (a service manager, a test's terminate()) would
    # leave it serving, and holding its port
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        server.proc.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
    return 0


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
