"""Running an exported library on a remote board, over TVM's RPC.

::

    with umahub.remote(tracker="farm:9190", key="rk3588") as board:   # or server="board1:9090"
        model = board.load("cnn.so")        # uploaded, loaded with its devices and weights
        outputs = model.run(*arrays)        # numpy in, numpy out, as umahub.load(...).run

A board runs ``python -m umahub.boards.board`` (TVM's RPC server with umahub's
loader registered, :mod:`umahub.boards.board`); a tracker (``python -m
tvm.exec.rpc_tracker``) hands boards out by key. Everything on the wire is
TVM's: ``tvm.rpc.connect``, ``connect_tracker``, ``TrackerSession.request``,
the session's upload.

Nothing waits without a limit: the tracker and the server are probed with a
socket timeout before TVM's client (which retries refused connections for a
minute) is asked; a request for a board waits at most ``timeout`` seconds for
a free one; every call on the board is given up after ``timeout`` seconds
(on the main thread: a ``SIGALRM`` interrupts TVM's wait), and the session
is then closed. Every failure is a
:class:`RemoteError` naming the board and what to do.

Why this module is long: the session, the model on the board and the two ways
of reaching a board share the one worker and the error wording; split up,
each piece would pass them to the others.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from umahub.boards.board import INFO, LAST_SECONDS, LOAD
from umahub.errors import UmahubError, last_line
from umahub.targets import elf_machine, machine_of, triple_of

__all__ = [
    "DEFAULT_TIMEOUT",
    "Board",
    "RemoteError",
    "RemoteModel",
    "connect",
    "elf_machine",
    "parse_address",
    "remote",
]

#: Seconds to wait for a tracker, a free board, or one call on a board.
DEFAULT_TIMEOUT = 60.0

_T = TypeVar("_T")


_BOARD_COMMAND = "python -m umahub.boards.board --tracker HOST:PORT --key KEY"


class RemoteError(UmahubError):
    """A remote run failed: no tracker, no free board, a board that cannot load the
    library or that went away; the message names the board and what to do."""


def parse_address(text: str, option: str = "address") -> tuple[str, int]:
    """``"host:port"`` as ``(host, port)``.

    Raises:
        RemoteError: not of that form.
    """
    host, _, port = str(text).strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RemoteError(f"{option} {text!r}: expected HOST:PORT (say 127.0.0.1:9190)")
    return host.strip("[]"), int(port)


def _probe(host: str, port: int, timeout: float, what: str, start: str) -> None:
    """Refuse at once an address where nothing listens (TVM's client would retry for a minute)."""
    try:
        socket.create_connection((host, port), timeout=min(timeout, 10.0)).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RemoteError(
            f"no {what} at {host}:{port} ({reason.lower()}); start one there ({start}) "
            "or check the address"
        ) from None


class _Timeout(Exception):
    pass


class _Worker:
    """Makes the calls of a session, each given up after a timeout.

    TVM's calls hold the GIL while they wait on the wire, so no other thread
    could notice the time: on the main thread a ``SIGALRM`` interrupts the
    wait (TVM checks for signals when a wait is interrupted, as for Ctrl-C).
    Off the main thread the call is made as it is (no signal can reach it).
    """

    def call(self, fn: Callable[[], _T], timeout: float) -> _T:
        if threading.current_thread() is not threading.main_thread():
            return fn()

        def expired(signum: int, frame: Any) -> None:
            raise _Timeout()

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return fn()
        except _Timeout:
            raise concurrent.futures.TimeoutError() from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def stop(self) -> None:
        """Nothing to stop (kept for the session's close)."""


class Board:
    """A session on one board (made by :func:`connect`, alias ``umahub.remote``).

    Attributes:
        name: how messages name it (``board 'rk3588' from tracker farm:9190``).
        timeout: seconds any one call on the board may take.
        info: the board's machine and versions (``machine``, ``apache-tvm``...).
    """

    def __init__(self, session: Any, name: str, timeout: float, worker: _Worker):
        self._session = session
        self.name = name
        self.timeout = timeout
        self._worker = worker
        self._broken = ""
        self._loaded: list[str] = []
        self.info: dict[str, Any] = {}
        try:
            loader = self._call(lambda: session.get_function(INFO), "connecting")
        except RemoteError:
            loader = None
        if loader is None:
            self.close()
            raise RemoteError(
                f"{name} runs TVM's plain RPC server, which cannot keep a model's weights on "
                f"its accelerator devices; start it with `{_BOARD_COMMAND}` (TVM's server with "
                "umahub's loader; umahub on the board, no plugins)"
            )
        self.info = json.loads(str(self._call(loader, "asking what it is")))

    def _call(self, fn: Callable[[], _T], doing: str, timeout: float | None = None) -> _T:
        """Run ``fn`` on the session's worker; every failure becomes a RemoteError."""
        if self._broken:
            raise RemoteError(self._broken)
        limit = self.timeout if timeout is None else timeout
        try:
            return self._worker.call(fn, limit)
        except concurrent.futures.TimeoutError:
            self._broken = (
                f"{self.name} did not answer within {limit:g} s while {doing}: it is hung, "
                "overloaded or unreachable; check the board, or allow more time (--timeout)"
            )
        except UmahubError:
            raise
        except Exception as exc:
            text = last_line(exc)
            if _connection_lost(exc):
                self._broken = (
                    f"{self.name} went away while {doing} ({text}); check that the board and "
                    "its RPC server are up, then run again"
                )
            else:
                raise RemoteError(f"{self.name} failed while {doing}: {text}") from exc
        self.close()
        raise RemoteError(self._broken)

    def load(self, path: str | os.PathLike) -> RemoteModel:
        """Upload an exported library and load it on the board with its devices and weights.

        Raises:
            UmahubError: not a umahub library, or a damaged one (checked here, first).
            RemoteError: built for another architecture than the board's, or the
                board cannot load it.
        """
        from umahub.runtime.compiled import _input_info, _read_metadata

        path = str(path)
        if not os.path.isfile(path):
            raise UmahubError(f"{path}: no such file")
        meta = _read_metadata(path)
        built_for = elf_machine(path)
        board_is = machine_of(self.info.get("machine", ""))
        if built_for and board_is and built_for != board_is:
            raise RemoteError(
                f"{self.name} cannot load {path}: the library is built for {built_for}, the "
                f"board is {board_is} (wrong architecture); compile for the board: umahub "
                f'compile MODEL --target "llvm -mtriple={triple_of(board_is)}" --cc '
                f"{triple_of(board_is)}-gcc"
            )
        name = f"umahub-{uuid.uuid4().hex[:12]}.so"
        session = self._session
        with open(path, "rb") as f:
            blob = bytearray(f.read())
        self._call(lambda: session.upload(blob, name), f"uploading {path}")
        load = self._call(lambda: session.get_function(LOAD), "loading")
        weights = json.dumps(meta.get("weights", []))
        devices = len(meta["devices"])
        try:
            run = self._call(lambda: load(name, devices, weights), f"loading {path}")
        except RemoteError as exc:
            if self._broken:
                raise
            if "pip install" in str(exc):  # a device runtime the board lacks: said already
                raise RemoteError(
                    f"{self.name} cannot load {path}: {str(exc).split(': ', 1)[-1]}"
                ) from exc
            raise RemoteError(
                f"{self.name} cannot load {path}: {str(exc).split(': ', 1)[-1]}; a library "
                "built for another machine (umahub compile --target/--cc) or a C library "
                "missing on the board are the usual causes"
            ) from exc
        self._loaded.append(name)
        return RemoteModel(path, meta["devices"], _input_info(meta["inputs"]), self, run)

    def close(self) -> None:
        """End the session (the board's RPC server removes what was uploaded)."""
        self._worker.stop()
        self._session = None

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Board({self.name!r})"


class RemoteModel:
    """An exported library loaded on a board: ``run`` it with numpy arrays.

    Attributes:
        path: the local library it was loaded from.
        devices: the virtual devices, index = the board's runtime device index.
        input_info: ``(shape, dtype)`` of each input, as :class:`umahub.LoadedModel`'s.
        board: the :class:`Board` it runs on.
    """

    def __init__(self, path: str, devices: list[str], input_info: list, board: Board, fn: Any):
        self.path, self.devices, self.input_info, self.board = path, devices, input_info, board
        self._fn = fn

    def run(self, *arrays: Any) -> Any:
        """One inference on the board; numpy in, numpy out (a list for several outputs).

        Raises:
            UmahubError: wrong inputs (checked before anything is sent).
            RemoteError: the board failed, went away or did not answer in time.
        """
        from umahub.runtime.running import check_inputs

        check_inputs(self.input_info, arrays)
        session, fn = self.board._session, self._fn

        def call() -> Any:
            import tvm

            host = session.cpu(0)
            tensors = [tvm.runtime.tensor(np.require(a, requirements="C"), host) for a in arrays]
            return _fetch(session, fn(*tensors))

        return self.board._call(call, f"running {os.path.basename(self.path)}")

    def board_seconds(self) -> float:
        """Seconds ``main`` took on the board in the last :meth:`run` (no transfers)."""
        session = self.board._session
        return float(
            self.board._call(
                lambda: session.get_function(LAST_SECONDS)(),
                "reading its clock",
            )
        )


def _fetch(session: Any, value: Any) -> Any:
    """A result of the board in numpy: tensors downloaded, a tuple (a remote array) as a list."""
    if hasattr(value, "numpy"):
        return value.numpy()
    if type(value).__name__ in ("Shape", "ShapeTuple"):
        return np.asarray(list(value), dtype="int64")
    if type(value).__name__ == "RPCObjectRef":
        size = session.get_function("ffi.ArraySize")
        item = session.get_function("ffi.ArrayGetItem")
        return [_fetch(session, item(value, i)) for i in range(int(size(value)))]
    return value


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the board's session ended, not that a call failed on it."""
    text = str(exc).lower()
    if "rpccode::kreturn" in text and re.search(r"code=(1|kshutdown)\b", text):
        # TVM's RPC endpoint, reading an answer from a channel that closed under it, gets
        # the protocol's shutdown code (kShutdown, 1) in place of a return: which of this
        # and a socket error a dead session gives depends on when it died
        return True
    return any(
        word in text
        for word in ("socket", "connection", "closed", "broken pipe", "eof", "shutdown", "recv")
    )


def connect(
    *,
    tracker: str | None = None,
    key: str | None = None,
    server: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Board:
    """A session on a board: a free one with ``key`` from a ``tracker``, or one ``server``.

    Args:
        tracker: ``"host:port"`` of TVM's tracker (``python -m tvm.exec.rpc_tracker``).
        key: the kind of board to ask the tracker for (with ``tracker``; with
            ``server``, the server's key, if it has one).
        server: ``"host:port"`` of one board (``python -m umahub.boards.board``), no tracker.
        timeout: seconds to wait for the tracker, for a free board, and for any
            one call on the board.

    Raises:
        RemoteError: no tracker or server answers, the tracker has no board
            with that key or none became free in time, or the board does not
            run umahub's loader.
    """
    if (tracker is None) == (server is None):
        raise RemoteError("give a tracker (with a key) or a server, not both nor neither")
    if timeout <= 0:
        raise RemoteError(f"timeout {timeout}: must be more than 0 seconds")
    worker = _Worker()
    try:
        if tracker is not None:
            if not key:
                raise RemoteError(
                    f"tracker {tracker}: give the key of the boards to ask it for (--key KEY)"
                )
            session, name = _request(tracker, key, timeout, worker)
        else:
            assert server is not None  # exactly one of the two, checked above
            session, name = _direct(server, key or "", timeout, worker)
    except BaseException:
        worker.stop()
        raise
    return Board(session, name, timeout, worker)


def _direct(server: str, key: str, timeout: float, worker: _Worker) -> tuple[Any, str]:
    from tvm import rpc

    host, port = parse_address(server, "server")
    name = f"board {host}:{port}"
    _probe(host, port, timeout, "RPC server", "python -m umahub.boards.board --port PORT")
    try:
        return worker.call(lambda: rpc.connect(host, port, key), timeout), name
    except concurrent.futures.TimeoutError:
        raise RemoteError(
            f"{name} accepted the connection but did not answer within {timeout:g} s; "
            "is it an RPC server (python -m umahub.boards.board) and is it serving someone else?"
        ) from None
    except Exception as exc:
        raise RemoteError(
            f"{name} refused the session: {last_line(exc)}; check the address and --key"
        ) from exc


def _request(tracker: str, key: str, timeout: float, worker: _Worker) -> tuple[Any, str]:
    from tvm import rpc

    host, port = parse_address(tracker, "tracker")
    start = "python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port PORT"
    _probe(host, port, timeout, "tracker", start)
    name = f"board '{key}' from tracker {host}:{port}"
    keys = _tracker_keys(host, port, timeout, worker)
    if key not in keys:
        known = ", ".join(f"{k} ({n})" for k, n in sorted(keys.items())) or "none"
        raise RemoteError(
            f"tracker {host}:{port} has no board with key {key!r} (boards by key: {known}); "
            f"start one with `{_BOARD_COMMAND}` or use one of those keys"
        )

    def request() -> Any:
        session = rpc.connect_tracker(host, port)
        # TVM's TrackerSession has no timeout of its own: its socket gets one, and one try.
        sock = getattr(session, "_sock", None)
        if sock is not None:
            sock.settimeout(timeout)
        try:
            return session.request(key, max_retry=1)
        finally:
            session.close()

    try:
        return worker.call(request, timeout + 5.0), name
    except (concurrent.futures.TimeoutError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "timed out" not in str(exc):
            detail = last_line(exc)
            raise RemoteError(f"{name}: the tracker could not connect it: {detail}") from exc
        raise RemoteError(
            f"no board with key {key!r} became free at tracker {host}:{port} within "
            f"{timeout:g} s ({keys[key]} registered, all busy); wait, add boards, or allow "
            "more time (--timeout)"
        ) from None


def _tracker_keys(host: str, port: int, timeout: float, worker: _Worker) -> dict[str, int]:
    """Key -> how many boards the tracker has (from its summary)."""
    from tvm import rpc

    def summary() -> Any:
        session = rpc.connect_tracker(host, port)
        sock = getattr(session, "_sock", None)
        if sock is not None:
            sock.settimeout(timeout)
        try:
            return session.summary()
        finally:
            session.close()

    try:
        data = worker.call(summary, timeout + 5.0)
    except Exception as exc:
        raise RemoteError(
            f"{host}:{port} does not answer as a TVM tracker ({last_line(exc) or 'no answer'}); "
            "check the address"
        ) from None
    counts: dict[str, int] = {}
    for server in data.get("server_info", []):
        k = str(server.get("key", "")).removeprefix("server:")
        counts[k] = counts.get(k, 0) + 1
    return counts


#: ``umahub.remote(...)``: the same as :func:`connect`.
remote = connect
