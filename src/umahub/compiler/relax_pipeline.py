"""umahub inside ``tvm.compile``: the plugins' partitioning, lowering and codegen as a
Relax pipeline.

A TVM user keeps TVM's own entry point::

    hub = umahub.Hub()
    pipeline = hub.relax_pipeline()
    executable = tvm.compile(mod, target="llvm", relax_pipeline=pipeline)
    compiled = pipeline.load(executable)      # run, export_library, report
    # or TVM's own tools, as for any executable:
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    executable.export_library("model.so")    # tvm.runtime.load_module("model.so")

or, with umahub installed, by name (``[tool.umahub]`` of the project)::

    executable = tvm.compile(mod, target="llvm", relax_pipeline="umahub")

It composes with TVM's passes and pipelines: before it, in a
``tvm.transform.Sequential([..., hub.relax_pipeline()])``; after umahub's
partitioning, in place of TVM's default pipeline, with ``then``
(``hub.relax_pipeline(then=tvm.transform.Sequential([my_pass,
relax.get_pipeline("default")]))``, or ``relax.get_pipeline("umahub",
then=...)``).

What ``tvm.compile`` gives works with TVM's own tools: every virtual device
is on one runtime device (``tvm.cpu(0)``; ``main`` reads every tensor where
it was made, without copies: :mod:`umahub.compiler.one_memory`), and
the C partitions and the plugins' kernel libraries (``c_sources``) are
compiled by umahub into object files (TVM static libraries) that
``export_library`` links as they are, without the plugins' include
directories.

The pipeline is one module pass: umahub's stages up to the build (plan,
partition, memory, lower through the plugins' hooks, codegen), which leave a
module whose partitions are calls of their runtime modules (the module
attribute ``external_mods``, which ``tvm.compile`` links), each on its
virtual device, with the copies between them; then TVM's default Relax
pipeline (or ``then``). The placement
and the report are those :meth:`umahub.Hub.compile` makes of the same model.

One difference from :meth:`umahub.Hub.compile`, because ``tvm.compile``
builds the module, not umahub: ``verify`` does not run (it rebuilds the model
when a partition is wrong); with ``verify = true`` the pipeline warns and
goes on. (The weights partitions read stay ``main``'s constants, read in
place, where ``Hub.compile`` makes them parameters, copied once at load.)

And one for partitions on devices of their own (``Accelerator(runtime=...)``,
codegen ``"device"``, the bundled simnpu's): their programs are loaded into
their runtimes in the process that compiled them (the packed functions
``umahub.device.<key>``), so TVM's VM runs them there; TVM's own
``export_library`` does not carry the programs, and the file it writes fails
in another process ("Cannot find function umahub.device.…"). The pipeline
says so when it runs, in one :class:`umahub.UmahubWarning` naming those
partitions and what carries them: ``pipeline.load(executable).export_library(path)``,
or, by name, ``umahub.Hub().compile(mod)`` and ``compiled.export_library(path)``.
A warning, not an error: the executable is right in this process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax

from umahub.compiler import codegen, pipeline
from umahub.compiler.stages import build
from umahub.errors import UmahubError, warn
from umahub.host import storage_plan
from umahub.host.lowering import lower_host
from umahub.tuning.lookup import recording as tuned_kernels

if TYPE_CHECKING:
    from umahub.compiler.compilation import Compilation, Progress
    from umahub.hub.hub import Hub
    from umahub.report.report import Report
    from umahub.runtime.compiled import Compiled

__all__ = ["RelaxPipeline"]


@tvm.transform.module_pass(opt_level=0, name="umahub")
class RelaxPipeline:
    """umahub's stages and then a Relax pipeline (TVM's default), as one pass for ``tvm.compile``.

    Made by :meth:`umahub.Hub.relax_pipeline`. ``then`` is the pipeline run
    after umahub's stages: a name of ``relax.get_pipeline`` or any pass (a
    ``tvm.transform.Sequential`` of TVM's passes ending with a pipeline that
    builds, as ``"default"`` does); it runs with TVM's passes that umahub's
    storage plan replaced disabled. After ``tvm.compile`` ran it,
    :attr:`report`, :attr:`devices` and :meth:`load` describe what it did
    (the last module it transformed).
    """

    def __init__(
        self,
        hub: Hub,
        placement: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        then: str | Any = "default",
        by_name: bool = False,
    ):
        self.hub = hub
        self.placement = placement
        self.progress = progress
        self.then = then
        #: Made by ``relax.get_pipeline("umahub")`` (``relax_pipeline="umahub"``): the
        #: user holds no pipeline to ``load`` the executable with.
        self.by_name = by_name
        self.compilation: Compilation | None = None

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        """Place, lower and codegen ``mod`` through the plugins, then TVM's default pipeline."""
        if self.hub.config.verify:
            warn(
                "verify = true is not applied inside tvm.compile (verification rebuilds "
                "the model); use umahub.Hub().compile to verify the partitions"
            )
        prepared, comp = pipeline.prepare(self.hub, mod, self.placement, self.progress)
        self._bind(comp)
        prepared = _linkable(prepared, comp)
        with tuned_kernels(fresh=False) as host_kernels:
            prepared, comp.host_functions = lower_host(self.hub, prepared)
        comp.tuned_kernels.extend(host_kernels)
        prepared = storage_plan.plan_storage(prepared)
        self.compilation = comp
        inner = tvm.transform.PassContext(
            opt_level=ctx.opt_level,
            required_pass=list(ctx.required_pass),
            disabled_pass=[*ctx.disabled_pass, *storage_plan.REPLACED_PASSES],
            config=dict(ctx.config),
            instruments=list(ctx.instruments),
        )
        after = relax.get_pipeline(self.then) if isinstance(self.then, str) else self.then
        with inner:
            return after(prepared)

    def _bind(self, comp: Compilation) -> None:
        """Load the device partitions' programs into their runtimes, in this process."""
        if not comp.device_calls:
            return
        warn(_in_process_only(list(comp.device_calls), self.by_name))
        from umahub.runtime.devices import bind

        try:
            self._bound = bind(list(comp.device_calls.values()))
        except UmahubError as exc:
            warn(
                f"{exc}: the executable runs where it is installed, exported by "
                "pipeline.load(executable).export_library(path)"
            )

    def _done(self) -> Compilation:
        if self.compilation is None:
            raise UmahubError(
                "the umahub pipeline has not run yet: pass it to "
                "tvm.compile(mod, target, relax_pipeline=pipeline) first"
            )
        return self.compilation

    @property
    def report(self) -> Report:
        """Where every operator runs and why, as :attr:`umahub.Compiled.report`."""
        return self._done().report()

    @property
    def devices(self) -> list[Any]:
        """The runtime devices a ``relax.VirtualMachine`` of the executable needs: one,
        ``tvm.cpu(0)`` (every virtual device runs on it inside ``tvm.compile``)."""
        self._done()
        return [tvm.cpu(0)]

    def load(self, executable: Any) -> Compiled:
        """The executable ``tvm.compile`` made with this pipeline, as a :class:`umahub.Compiled`.

        It runs with numpy in and out, exports with the plugins' kernel
        libraries linked in (:meth:`umahub.Compiled.export_library`), and
        carries the report.
        """
        comp = self._done()
        compiled = build.load(comp, executable, kernels_linked=True)
        compiled.report = comp.report()
        return compiled


#: Device partitions the warning of :func:`_in_process_only` names; the rest are counted.
_NAMED_PARTITIONS = 3


def _in_process_only(symbols: list[str], by_name: bool) -> str:
    """The one line that says an executable's device partitions run only in this process."""
    named = ", ".join(symbols[:_NAMED_PARTITIONS])
    if len(symbols) > _NAMED_PARTITIONS:
        named += f" and {len(symbols) - _NAMED_PARTITIONS} more"
    instead = (
        "umahub.Hub().compile(mod) and compiled.export_library(path)"
        if by_name
        else "pipeline.load(executable).export_library(path)"
    )
    several = len(symbols) > 1
    return (
        f"device partition{'s' if several else ''} {named} run{'' if several else 's'} "
        "on programs bound in this process only: TVM's export_library cannot carry them "
        "(the exported file fails elsewhere with 'Cannot find function umahub.device...'); "
        f"for a library that carries them use {instead}"
    )


def _linkable(mod: tvm.IRModule, comp: Compilation) -> tvm.IRModule:
    """``mod`` with its C partitions and the plugins' kernel libraries as object files
    (:func:`umahub.compiler.codegen.static_libraries`): what TVM's own
    ``export_library`` and ``relax.VirtualMachine`` link without umahub's options."""
    external = list((mod.attrs or {}).get("external_mods", []))
    placed = comp.placed()
    partitions = [
        (p.symbol, comp.modules[p.symbol], comp.hub.accelerator(p.accelerator))
        for p in placed.partitions
    ]
    cc = comp.target.cc if comp.target is not None else None
    libraries, kernels = codegen.static_libraries(partitions, cc, native=comp.target is None)
    if not libraries and not kernels:
        return mod
    by_symbol = {symbol: module for symbol, module, _ in partitions}
    replaced = []
    for module in external:
        symbol = next((s for s, m in by_symbol.items() if m.same_as(module)), None)
        replaced.append(libraries.get(symbol, module) if symbol is not None else module)
    return mod.with_attr("external_mods", [*replaced, *kernels])
