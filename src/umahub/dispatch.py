"""Hook dispatch in the user's order, on pluggy.

pluggy calls a hook's implementations in the reverse order of their
registration. To give every hook its own order (``[tool.umahub.hook-order]``)
with pluggy's public API only, each implementation is registered on its own, as
a one-hook *shim*, in the order wanted for that hook. Calling a hook is then
plain pluggy: the ordering costs nothing per call.

In the traced manager the pipeline uses, each implementation is wrapped so
that, while a compile records (see :func:`recording`), every call is logged
with its plugin, hook, duration and whether it returned something: that is
what the report shows per partition. An exception leaving an implementation
gets ``exc.umahub_culprit = (plugin, hook)``, so that errors name the plugin at
fault. ``hub.hook`` is untraced: plain pluggy dispatch, nothing added per call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from umahub import hookspecs
from umahub.loading import PluginInfo, unknown_hook_message
from umahub.markers import PROJECT_NAME

__all__ = [
    "HOOK_NAMES",
    "HookCall",
    "PluginManager",
    "last_returned",
    "recording",
    "returned_by",
    "running_on",
]

#: The hook names of the contract, in pipeline order.
HOOK_NAMES: tuple[str, ...] = tuple(n for n in vars(hookspecs) if n.startswith("umahub_"))


@dataclass(frozen=True)
class HookCall:
    """One call of one plugin's implementation, as the report shows it."""

    plugin: str
    hook: str
    seconds: float
    returned: bool


_LOG: contextvars.ContextVar[list[HookCall] | None] = contextvars.ContextVar(
    "umahub_hook_log", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[HookCall]]:
    """Collect the :class:`HookCall` of every implementation called in the block."""
    log: list[HookCall] = []
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def last_returned(hook: str) -> str | None:
    """The plugin whose implementation of ``hook`` last returned a value in this recording."""
    givers = returned_by(hook, 1)
    return givers[0] if givers else None


def returned_by(hook: str, count: int) -> list[str]:
    """The plugins of the last ``count`` calls of ``hook`` that returned a value, in call order.

    pluggy leaves None results out of a hook's result list; this lines the
    results up with the plugins that gave them.
    """
    givers = [c.plugin for c in (_LOG.get() or []) if c.hook == hook and c.returned]
    return givers[len(givers) - count :] if count else []


# thread id -> (plugin, hook) of the traced implementation running on it, for the
# message of a time limit that expired (see umahub.timelimit).
_RUNNING: dict[int, tuple[str, str]] = {}


def running_on(thread_id: int | None) -> tuple[str, str] | None:
    """(plugin, hook) of the traced implementation running on that thread, if any."""
    return _RUNNING.get(thread_id) if thread_id is not None else None


def _recorded(plugin: str, hook: str, func: Any) -> Any:
    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        log = _LOG.get()
        me = threading.get_ident()
        outer = _RUNNING.get(me)
        _RUNNING[me] = (plugin, hook)
        try:
            if log is None:
                return func(*args, **kwargs)
            start = time.perf_counter()
            result = func(*args, **kwargs)
        except Exception as exc:
            if not hasattr(exc, "umahub_culprit"):
                exc.umahub_culprit = (plugin, hook)  # type: ignore[attr-defined]
            raise
        finally:
            if outer is None:
                _RUNNING.pop(me, None)
            else:
                _RUNNING[me] = outer
        log.append(HookCall(plugin, hook, time.perf_counter() - start, result is not None))
        return result

    return call


class _Shim:
    """One implementation of one hook, registered on its own."""

    def __init__(self, hook: str, function: Any, opts: dict[str, Any]):
        self.hook = hook
        self.opts = opts
        self.__dict__[hook] = function


class PluginManager(pluggy.PluginManager):
    """pluggy's manager for the project ``"umahub"``, with per-hook ordering."""

    def __init__(self) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(hookspecs)

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        """Shims carry their options; everything else is pluggy's default."""
        if isinstance(plugin, _Shim):
            return dict(plugin.opts) if name == plugin.hook else None
        return super().parse_hookimpl_opts(plugin, name)

    def implementations(self, info: PluginInfo) -> dict[str, tuple[Any, dict[str, Any]]]:
        """Check a loaded plugin's hook implementations against the specs.

        Returns hook name -> (function, hookimpl options). Raises ValueError
        with a message for the user for an unknown hook name or an argument that
        umahub does not pass; pluggy checks the rest when the implementations
        are registered.
        """
        found: dict[str, tuple[Any, dict[str, Any]]] = {}
        for attr in dir(info.obj):
            opts = super().parse_hookimpl_opts(info.obj, attr)
            if opts is None:
                continue
            hook = opts.get("specname") or attr
            if hook not in HOOK_NAMES:
                raise ValueError(unknown_hook_message(hook, HOOK_NAMES))
            function = getattr(info.obj, attr)
            spec_args = getattr(self.hook, hook).spec.argnames
            wanted = [
                n
                for n, p in inspect.signature(function).parameters.items()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            extra = [n for n in wanted if n not in spec_args]
            if extra:
                raise ValueError(
                    f"{hook}({', '.join(wanted)}) takes {', '.join(repr(n) for n in extra)}, "
                    f"which umahub does not pass to {hook}; it passes: {', '.join(spec_args)}"
                )
            found[hook] = (function, dict(opts))
        return found

    def register_ordered(
        self,
        plugins: Sequence[PluginInfo],
        impls: Mapping[str, Mapping[str, tuple[Any, dict[str, Any]]]],
        hook_order: Mapping[str, Sequence[str]],
        traced: bool = False,
    ) -> None:
        """Register every implementation so that each hook runs in its order.

        Args:
            plugins: loaded plugins in plugin order.
            impls: plugin name -> what :meth:`implementations` returned.
            hook_order: hook name -> plugin names that go first, in that order;
                for such a hook the authors' ``tryfirst``/``trylast`` are ignored.
            traced: wrap each implementation to log its calls (see
                :func:`recording`) and name the culprit of an exception; costs a
                fraction of a microsecond per implementation and call, so the
                hub keeps a traced manager for its pipeline and an untraced one
                for ``hub.hook``.
        """
        for hook in HOOK_NAMES:
            names = [p.name for p in plugins if hook in impls[p.name]]
            configured = hook_order.get(hook)
            if configured is not None:
                first = [n for n in configured if n in names]
                names = first + [n for n in names if n not in first]
            # pluggy calls the last registered first.
            for name in reversed(names):
                function, opts = impls[name][hook]
                if configured is not None:
                    opts = {**opts, "tryfirst": False, "trylast": False}
                if traced and not (opts.get("wrapper") or opts.get("hookwrapper")):
                    function = _recorded(name, hook, function)
                self.register(_Shim(hook, function, opts), name=f"{name}::{hook}")

    def call_order(self, hook: str) -> list[str]:
        """The plugin names of ``hook``'s implementations, in the order they run."""
        caller = getattr(self.hook, hook)
        return [impl.plugin_name.split("::")[0] for impl in reversed(caller.get_hookimpls())]
