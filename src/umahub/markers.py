"""The pluggy markers of the project ``"umahub"`` and the hook contract version."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "umahub"

#: The version of the hook contract this umahub speaks. A plugin states the
#: contract it was written for with a module-level ``UMAHUB_API = 1``.
API_VERSION = 1

#: The contract versions this umahub can drive.
SUPPORTED_API_VERSIONS = frozenset({1})

#: Marks a function of ``hookspecs`` as a hook specification.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

#: Marks a plugin function as the implementation of the hook of the same name::
#:
#:     @umahub.hookimpl
#:     def umahub_accelerators():
#:         return [umahub.Accelerator("my_accel", codegen="c")]
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
