"""The pluggy markers of the project ``"umahub"`` and the hook contract version."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pluggy

_F = TypeVar("_F", bound=Callable[..., Any])

PROJECT_NAME = "umahub"

#: The version of the hook contract this umahub speaks. A plugin states the
#: contract it was written for with a module-level ``UMAHUB_API = 1``.
API_VERSION = 1

#: The contract versions this umahub can drive.
SUPPORTED_API_VERSIONS = frozenset({1})

#: Marks a function of ``hookspecs`` as a hook specification.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

#: The key of a hook implementation's options that holds the accelerators it is for.
ACCELERATOR_OPTION = "accelerator"


class HookimplMarker(pluggy.HookimplMarker):  # type: ignore[misc]  # pluggy's is final
    """pluggy's ``HookimplMarker``, plus ``accelerator=``: which accelerators a hook is for.

    ``@umahub.hookimpl(accelerator="npu")`` on an implementation of a hook that
    takes an ``accelerator`` makes umahub call it for that accelerator only; for
    any other, the call is skipped as if it had returned ``None``. It replaces
    the ``if accelerator.name != NAME: return None`` at the top of every hook.
    ``accelerator`` is a name or a list of names, each an accelerator the same
    plugin declares in ``umahub_accelerators`` (anything else is a load error
    naming the plugin and the accelerator). With pluggy's ``specname``, one
    plugin gives one implementation of a hook per accelerator::

        @umahub.hookimpl(accelerator="npu", specname="umahub_schedule")
        def schedule_npu(schedule, context): ...

        @umahub.hookimpl(accelerator="npu_lite", specname="umahub_schedule")
        def schedule_npu_lite(schedule): ...

    The decorated function itself is unchanged (a test may call it directly);
    the hub applies the filter, in ``hub.hook`` as in the compile pipeline.
    The other options are pluggy's (``tryfirst``, ``trylast``, ``wrapper``,
    ``hookwrapper``, ``specname``, ``optionalhook``); a plugin's
    implementations of one hook for different accelerators must agree on
    them, as pluggy calls them as one implementation.
    """

    def __call__(  # type: ignore[override]
        self,
        function: _F | None = None,
        *,
        accelerator: str | Iterable[str] | None = None,
        **options: Any,
    ) -> Any:
        names = _accelerator_names(accelerator)
        mark = super().__call__(**options)

        def decorate(func: _F) -> _F:
            func = mark(func)
            if names is not None:
                getattr(func, self.project_name + "_impl")[ACCELERATOR_OPTION] = names
            return func

        return decorate(function) if function is not None else decorate


def _accelerator_names(accelerator: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if accelerator is None:
        return None
    try:
        names = (accelerator,) if isinstance(accelerator, str) else tuple(accelerator)
    except TypeError:
        names = ()
    if not names or not all(isinstance(n, str) and n for n in names):
        raise TypeError(
            "@umahub.hookimpl(accelerator=...) takes an accelerator name or a list of "
            f"names, got {accelerator!r}"
        )
    return tuple(dict.fromkeys(names))


#: Marks a plugin function as the implementation of the hook of the same name::
#:
#:     @umahub.hookimpl
#:     def umahub_accelerators():
#:         return [umahub.Accelerator("my_accel", codegen="c")]
#:
#:     @umahub.hookimpl(accelerator="my_accel")  # called for my_accel only
#:     def umahub_patterns():
#:         return [("my_accel.relu", is_op("relax.nn.relu")(wildcard()))]
#:
#: See :class:`HookimplMarker` for ``accelerator=``.
hookimpl = HookimplMarker(PROJECT_NAME)
