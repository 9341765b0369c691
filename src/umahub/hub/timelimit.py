"""A time limit around plugin code (``hook-timeout`` in ``[tool.umahub]``).

Python cannot stop a thread safely, and a hook may be deep inside TVM's C++
when its time runs out. So the limited work runs on a worker thread while the
compile waits for it at most ``seconds``; when the time is up, the compile
goes on without it (the partition falls back to the host, or the compile
stops, as ``on-error`` says) and the worker is *left running* in the
background, a daemon thread that ends with the process. Whatever it returns
later is thrown away. What cannot be helped: a hook that holds Python's global
lock without ever releasing it (a C extension's endless loop) stops the whole
process, time limit or not.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from umahub.errors import USER_LINE, HookTimeoutError, PluginFailure, user_line
from umahub.hub.tracing import running_on

__all__ = ["within"]

T = TypeVar("T")


def within(seconds: float, work: Callable[[], T], what: str) -> T:
    """Run ``work()`` and return its result, or raise if it takes longer than ``seconds``.

    ``seconds <= 0`` runs ``work`` directly, with no limit. The worker sees the
    caller's context variables (the hook log of the report, the size bounds).

    Raises:
        PluginFailure: the time ran out while a traced hook was running: the
            failure names its plugin and hook, its cause is the HookTimeoutError.
        HookTimeoutError: the time ran out, and no traced hook was running.
        Exception: whatever ``work`` raised.
    """
    if seconds <= 0:
        return work()
    context = contextvars.copy_context()
    context.run(USER_LINE.set, user_line())  # where its warnings point
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = context.run(work)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"umahub: {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        culprit = running_on(worker.ident)
        error = HookTimeoutError(
            f"did not finish within {seconds:g} s (hook-timeout); its thread cannot be "
            "stopped safely and is left running in the background"
        )
        if culprit is not None:
            plugin, hook = culprit
            raise PluginFailure(plugin, hook, error) from error
        raise error
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
