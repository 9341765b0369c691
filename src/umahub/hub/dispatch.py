"""Hook dispatch in the user's order, on pluggy.

pluggy calls a hook's implementations in the reverse order of their
registration. To give every hook its own order (``[tool.umahub.hook-order]``)
with pluggy's public API only, each implementation is registered on its own, as
a one-hook *shim*, in the order wanted for that hook. Calling a hook is then
plain pluggy: the ordering costs nothing per call.

In the traced manager the pipeline uses, each implementation is wrapped so
that, while a compile records, every call is logged with its plugin, hook,
duration and whether it returned something (:mod:`umahub.hub.tracing`): that is
what the report shows per partition. An exception leaving an implementation
leaves it as a :class:`umahub.errors.PluginFailure` (plugin, hook, the original
as its cause), so that errors name the plugin at fault. ``hub.hook`` is
untraced: plain pluggy dispatch, nothing added per call.

An implementation marked ``@umahub.hookimpl(accelerator=...)`` (see
:class:`umahub.plugin.markers.HookimplMarker`) is registered behind a *router*: a
function taking the hook's ``accelerator`` (and whatever the implementations
take) that calls the implementation for that accelerator and returns ``None``
for any other. A plugin's implementations of one hook, one per accelerator,
share one router, so they are one implementation for pluggy and for the
ordering. Both managers register the routers, so ``hub.hook`` honours the
marker as the pipeline does; the traced manager logs only the calls a router
makes, not the ones it skips.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from umahub.errors import did_you_mean
from umahub.hub import tracing
from umahub.hub.loading import PluginInfo, unknown_hook_message
from umahub.plugin import hookspecs
from umahub.plugin.markers import ACCELERATOR_OPTION, PROJECT_NAME

__all__ = ["HOOK_NAMES", "PluginManager"]

#: The hook names of the contract, in pipeline order.
HOOK_NAMES: tuple[str, ...] = tuple(n for n in vars(hookspecs) if n.startswith("umahub_"))


@dataclass(frozen=True)
class _Impl:
    """One marked function of a plugin, as :meth:`PluginManager.implementations` found it."""

    attr: str
    function: Any
    opts: dict[str, Any]
    args: tuple[str, ...]  # the arguments pluggy passes to it
    accelerators: tuple[str, ...] | None  # from accelerator=...; None: every accelerator


# The body of a router, by the kind of implementation it routes. ``_pick`` returns
# the call for the accelerator (all the router's arguments in, the implementation's
# out) or None.
_ROUTER_SOURCE = {
    "call": (
        "def {name}({args}):\n"
        "    call = _pick(accelerator)\n"
        "    if call is None:\n"
        "        return None\n"
        "    return call({args})\n"
    ),
    "wrapper": (
        "def {name}({args}):\n"
        "    call = _pick(accelerator)\n"
        "    if call is None:\n"
        "        return (yield)\n"
        "    return (yield from call({args}))\n"
    ),
    "hookwrapper": (
        "def {name}({args}):\n"
        "    call = _pick(accelerator)\n"
        "    if call is None:\n"
        "        yield\n"
        "        return\n"
        "    yield from call({args})\n"
    ),
}


@dataclass(frozen=True)
class _Routes:
    """What a router is made of, kept on it to make its traced twin."""

    hook: str
    argnames: tuple[str, ...]
    kind: str
    targets: tuple[tuple[tuple[str, ...], Any, tuple[int, ...]], ...]  # (names, function, index)

    def router(self, wrap: Any = None) -> Any:
        """The router function; ``wrap(function)`` is applied to each implementation."""
        table: dict[str, Any] = {}
        for names, function, index in self.targets:
            call = _adapter(wrap(function) if wrap is not None else function, index)
            table.update(dict.fromkeys(names, call))

        def pick(accelerator: Any) -> Any:
            return table.get(getattr(accelerator, "name", accelerator))

        # pluggy passes a function the arguments its code object names, so the
        # router is compiled with the names of the hook's arguments it needs.
        namespace: dict[str, Any] = {"_pick": pick}
        source = _ROUTER_SOURCE[self.kind].format(name=self.hook, args=", ".join(self.argnames))
        exec(compile(source, f"<umahub router of {self.hook}>", "exec"), namespace)
        router = namespace[self.hook]
        first = self.targets[0][1]
        router.__module__ = getattr(first, "__module__", None)
        router.__doc__ = f"{self.hook} for " + ", ".join(
            f"{'/'.join(names)}: {getattr(f, '__qualname__', f)}" for names, f, _ in self.targets
        )
        router.umahub_routes = self
        return router


def _adapter(function: Any, index: tuple[int, ...]) -> Any:
    def call(*args: Any) -> Any:
        return function(*[args[i] for i in index])

    return call


def _first_call_returns(function: Any, result: Any, error: BaseException | None) -> Any:
    """``function``, whose first call gives ``result`` (or raises ``error``) without running.

    The hub calls ``umahub_accelerators`` once per plugin when it loads it; the
    accelerator marker check has already called it, so that call is replayed.
    """
    pending = [True]

    @functools.wraps(function)
    def replay(*args: Any, **kwargs: Any) -> Any:
        if pending:
            pending.clear()
            if error is not None:
                raise error
            return result
        return function(*args, **kwargs)

    return replay


class _Shim:
    """One implementation of one hook, registered on its own."""

    def __init__(self, hook: str, function: Any, opts: dict[str, Any]):
        self.hook = hook
        self.opts = opts
        self.__dict__[hook] = function


def _shown(names: tuple[str, ...]) -> str:
    return repr(names[0]) if len(names) == 1 else repr(list(names))


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

        Returns hook name -> (function, hookimpl options). Implementations
        marked ``accelerator=...`` come back as one router per hook (see the
        module's documentation). Raises ValueError with a message for the user
        for an unknown hook name, an argument that umahub does not pass, two
        implementations of one hook that are not for different accelerators,
        or an accelerator the plugin does not declare; pluggy checks the rest
        when the implementations are registered.
        """
        groups: dict[str, list[_Impl]] = {}
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
            options: dict[str, Any] = dict(opts)
            names = options.pop(ACCELERATOR_OPTION, None)
            if names is not None and "accelerator" not in spec_args:
                per_accelerator = [
                    h for h in HOOK_NAMES if "accelerator" in getattr(self.hook, h).spec.argnames
                ]
                raise ValueError(
                    f"hook implementation '{attr}' is marked accelerator={_shown(names)}, but "
                    f"{hook} is not called per accelerator; the hooks that are: "
                    f"{', '.join(per_accelerator)}"
                )
            groups.setdefault(hook, []).append(_Impl(attr, function, options, tuple(wanted), names))
        found: dict[str, tuple[Any, dict[str, Any]]] = {}
        for hook, group in groups.items():
            if len(group) == 1 and group[0].accelerators is None:
                found[hook] = (group[0].function, group[0].opts)
            else:
                found[hook] = self._routed(hook, group)
        marked = [
            (impl, name) for g in groups.values() for impl in g for name in impl.accelerators or ()
        ]
        declared = self._declared(found) if marked else None
        if declared is not None:
            for impl, name in marked:
                if name not in declared:
                    raise ValueError(
                        f"hook implementation '{impl.attr}' is marked accelerator='{name}', "
                        f"which this plugin does not declare{did_you_mean(name, declared)}; "
                        f"it declares: {', '.join(declared) or 'no accelerator'} (a hook for "
                        "another plugin's accelerator checks accelerator.name itself)"
                    )
        return found

    def _routed(self, hook: str, group: list[_Impl]) -> tuple[Any, dict[str, Any]]:
        """One router for a plugin's implementations of ``hook`` marked with accelerators."""
        attrs = ", ".join(f"'{i.attr}'" for i in group)
        if any(i.accelerators is None for i in group):
            raise ValueError(
                f"{len(group)} implementations of {hook} ({attrs}): umahub calls one per plugin "
                "and hook, unless each is for its own accelerators: mark them "
                "@umahub.hookimpl(accelerator=...)"
            )
        seen: dict[str, str] = {}
        for impl in group:
            for name in impl.accelerators or ():
                if name in seen:
                    raise ValueError(
                        f"two implementations of {hook} are for accelerator '{name}': "
                        f"'{seen[name]}' and '{impl.attr}'"
                    )
                seen[name] = impl.attr
        shared = [{k: v for k, v in i.opts.items() if k != "specname"} for i in group]
        if any(o != shared[0] for o in shared[1:]):
            raise ValueError(
                f"the implementations of {hook} ({attrs}) differ in their options "
                "(tryfirst, trylast, wrapper, hookwrapper): pluggy orders and calls them as one "
                "implementation, so they must agree"
            )
        opts = {**shared[0], "specname": None}
        kind = (
            "wrapper"
            if opts.get("wrapper")
            else "hookwrapper"
            if opts.get("hookwrapper")
            else "call"
        )
        spec_args = getattr(self.hook, hook).spec.argnames
        argnames = tuple(
            n for n in spec_args if n == "accelerator" or any(n in i.args for i in group)
        )
        targets = tuple(
            (i.accelerators or (), i.function, tuple(argnames.index(n) for n in i.args))
            for i in group
        )
        return _Routes(hook, argnames, kind, targets).router(), opts

    @staticmethod
    def _declared(found: dict[str, tuple[Any, dict[str, Any]]]) -> list[str] | None:
        """The names of the accelerators the plugin declares; None when that is not known.

        Calls its ``umahub_accelerators``, whose result (or exception) the
        hub's own call then gets, so the plugin is still asked once.
        """
        entry = found.get("umahub_accelerators")
        if entry is None:
            return []
        function, opts = entry
        if opts.get("wrapper") or opts.get("hookwrapper"):
            return None
        try:
            result = function()
        except Exception as exc:  # the hub reports it when it calls the hook
            found["umahub_accelerators"] = (_first_call_returns(function, None, exc), opts)
            return None
        found["umahub_accelerators"] = (_first_call_returns(function, result, None), opts)
        if not isinstance(result, (list, tuple)):
            return None  # the hub reports what is wrong with it
        names = [getattr(a, "name", None) for a in result]
        strings = [n for n in names if isinstance(n, str)]
        return strings if len(strings) == len(names) else None

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
                :func:`umahub.hub.tracing.recording`) and name the culprit of
                an exception; the wrapper adds a call to every call of every
                implementation, so the hub keeps a traced manager for its
                pipeline and an untraced one for ``hub.hook``.
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
                    routes = getattr(function, "umahub_routes", None)
                    if isinstance(routes, _Routes):  # log the calls it makes, not those it skips
                        function = routes.router(functools.partial(tracing.traced, name, hook))
                    else:
                        function = tracing.traced(name, hook, function)
                self.register(_Shim(hook, function, opts), name=f"{name}::{hook}")

    def call_order(self, hook: str) -> list[str]:
        """The plugin names of ``hook``'s implementations, in the order they run."""
        caller = getattr(self.hook, hook)
        return [impl.plugin_name.split("::")[0] for impl in reversed(caller.get_hookimpls())]
