"""umahub's entry in TVM's ``tvm.backends`` entry-point group.

apache-tvm 0.25+ calls every ``tvm.backends`` entry point at ``import tvm``, in
no particular order, with one global switch (``TVM_DEVICE_BACKEND_AUTOLOAD=0``)
and a warning for one that fails. That suits registering a name, not loading
backends that need ordering and a configuration, so umahub does only this
there: it registers the Relax pipeline name ``"umahub"``, so that
``tvm.compile(mod, target, relax_pipeline="umahub")`` runs umahub's plugins
(:mod:`umahub.compiler.relax_pipeline`). The plugins themselves stay in umahub's own
group, ``umahub.plugins``, loaded when a hub is made, ordered by
``[tool.umahub]``; ``umahub plugins`` lists the ``tvm.backends`` entry points
too, so that everything that hooks into TVM is in one list.

This module is imported while ``import tvm`` runs: it imports nothing of
umahub's at the top and loads no plugin.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PIPELINE_NAME", "register"]

PIPELINE_NAME = "umahub"


def register() -> None:
    """Register the pipeline name ``"umahub"`` with TVM's ``relax.get_pipeline``."""
    from tvm.relax import pipeline as tvm_pipelines

    if PIPELINE_NAME not in tvm_pipelines.PIPELINE_MAP:
        tvm_pipelines.register_pipeline(PIPELINE_NAME)(_by_name)


def _by_name(**options: Any) -> Any:
    """``relax.get_pipeline("umahub", placement=..., then=..., config=...)``: a hub of
    the project.

    ``options`` are :class:`umahub.Hub`'s keyword arguments, ``placement`` and
    ``then`` (:meth:`umahub.Hub.relax_pipeline`'s).
    """
    from umahub.compiler.relax_pipeline import RelaxPipeline
    from umahub.hub.hub import Hub

    placement = options.pop("placement", None)
    then = options.pop("then", "default")
    return RelaxPipeline(Hub(**options), placement, then=then, by_name=True)
