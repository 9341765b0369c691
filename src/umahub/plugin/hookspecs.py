"""The hook specifications: the contract between umahub and an accelerator plugin.

A plugin is a module (or an object) whose functions are marked with
``@hookimpl`` (of :mod:`umahub.plugin`, the one package a plugin imports) and
named after the hooks below. pluggy passes arguments by name, so an
implementation takes only the arguments it needs, in any order::

    from umahub.plugin import Accelerator, hookimpl

    UMAHUB_API = 1  # the contract this plugin was written for

    @hookimpl
    def umahub_accelerators():
        return [Accelerator("my_accel", codegen="c")]

The hooks are called in the order of the compile pipeline, which is also the
order of this file: discovery, partition (with placement by cost, the costs of
the candidate groups), lowering (Relax to TIR, schedule, TIR passes), codegen,
the search spaces ``umahub tune`` asks for, and the host's schedules when the
model is built.

Hooks that take an ``accelerator`` are called for every accelerator. Mark an
implementation with the accelerator(s) it is for, and umahub calls it for
those only (for any other, the call is skipped as if it had returned
``None``); it then takes ``accelerator`` only if it needs it::

    @hookimpl(accelerator="my_accel")
    def umahub_patterns():
        return [("my_accel.relu", op("relax.nn.relu"))]

``accelerator=`` takes a name or a list of names, each declared by the same
plugin's ``umahub_accelerators`` (another name is a load error that names
the plugin and the accelerator). A plugin with several accelerators gives one
implementation per accelerator with pluggy's ``specname``
(``@umahub.hookimpl(accelerator="b", specname="umahub_schedule")``); they must
agree on ``tryfirst``/``trylast``/``wrapper``. An unmarked implementation is
called for every accelerator and returns ``None`` (or does nothing) for one
that is not its own, as a plugin for another plugin's accelerator does.

Implementations of one hook run in the plugin order of ``[tool.umahub]``
(``plugins``, else entry-point names sorted), reordered per hook by
``[tool.umahub.hook-order]``. Where a hook's order is not configured, pluggy's
``tryfirst``/``trylast`` set by an author are respected.

The ``context`` argument is a :class:`umahub.CompileContext`: what earlier
stages decided (the config, the accelerator and instance, the partition's
operators, the memory plan so far, the target of a cross build) and the
accelerator's backend options. Hooks read it; they never change it.

``context.options`` (of :class:`umahub.CompileContext` and
:class:`umahub.CostContext`) is a read-only mapping of every option the
accelerator declares (``Accelerator(options=[Option("tile-rows", 16)])``,
:class:`umahub.plugin.Option`), by its declared name: the user's value from
``[tool.umahub.options.<accelerator>]``, ``--option ACC.KEY=VALUE`` or
``Hub(config={"options": ...})``, already checked against the option's type
and choices, or the declared default. A hook never sees an option that was
not declared, nor a value of another type::

    @hookimpl(accelerator="my_accel")
    def umahub_schedule(schedule, context):
        rows = context.options["tile-rows"]
        ...
        return f"tiled {rows} rows"

When a hook fails
-----------------

umahub runs vendors' code it does not know, so everything a hook does is
checked, and every failure is *one* thing: a plugin failure of the partition
(or, for ``umahub_patterns``, of the accelerator), named by plugin, hook and
partition. What follows is set by ``on-error`` in ``[tool.umahub]``:
``"fallback"`` (the default) sends the partition to the host, warns with an
:class:`umahub.UmahubWarning` and adds the message to ``report.notes``;
``"error"`` stops the compile with a :class:`umahub.errors.CompileError` of the
same message. A plugin failure is any of:

* the hook raises (any exception, including from a TIR pass or a pattern
  ``check`` it returned: a check that raises refuses its match);
* the hook returns something its specification below does not allow (a
  :class:`~umahub.errors.PluginOutputError`, checked by :mod:`umahub.hub.contract`:
  patterns that are not patterns, a PrimFunc whose parameters are not the
  partition's inputs then outputs in their shapes and dtypes, a codegen result
  that is not a runtime module or does not define ``context.symbol``);
* generated C that does not compile (compiled when the partition is lowered);
* in a cross build, LLVM code built for another architecture than
  ``context.target``'s;
* the hooks of one partition take longer than ``hook-timeout`` seconds (a
  :class:`~umahub.errors.HookTimeoutError`; the hook's thread cannot be
  stopped and is left running in the background);
* with ``verify = true``, the partition's outputs differ from the host's
  lowering of the same operators on the model's own values (a
  :class:`~umahub.errors.VerificationError`, see :mod:`umahub.compiler.stages.verify`).

A hook never has to catch its own errors to protect the compile; it should
raise with a message a user can act on.

Threads
-------

Within one compile, hooks are called one at a time. With a ``hook-timeout``
(the default), ``umahub_patterns`` and the lowering hooks of a partition run
on a worker thread that the compile waits for, so a hook must not rely on
running on the thread that called ``Hub.compile`` (thread-locals set there are
not seen). A compiled or loaded model may be ``run`` from any number of
threads at once.

Contract versions
-----------------

A plugin states the contract it was written for with ``UMAHUB_API``; umahub
refuses a plugin written for a contract it does not speak
(:data:`umahub.plugin.markers.SUPPORTED_API_VERSIONS`).

* ``1`` (umahub 0.1): :func:`umahub_accelerators`, :func:`umahub_patterns`,
  :func:`umahub_relax_to_tir`, :func:`umahub_schedule`,
  :func:`umahub_tir_passes` and :func:`umahub_codegen`. Contract ``1`` also
  covers what was added without changing what a correct plugin writes:

  - outputs checked at compile time, ``hook-timeout`` and ``verify``;
  - ``@umahub.hookimpl(accelerator=...)`` (a plugin that checks
    ``accelerator.name`` itself works unchanged);
  - ``umahub.Refusal`` for a pattern check's reason (a check returning a
    bool works unchanged);
  - :func:`umahub_host_schedule`: the host's schedules, which a plugin may
    replace (one that does not implement it changes nothing);
  - ``context.target``: the LLVM target of a cross build (``hub.compile(mod,
    target=...)``, ``umahub compile --target``), None when the model is built
    for this machine. A plugin that ignores it works for native builds; one
    that builds LLVM itself must build for it in a cross build;
  - :func:`umahub_cost` (a group's seconds for placement by cost; a group no
    implementation costs is measured) and ``MemoryPool(bandwidth=...)``;
  - backend options: ``Accelerator(options=...)`` and ``context.options``
    (a plugin that declares none sees an empty mapping);
  - :func:`umahub_tuning_space`: a search space for ``umahub tune`` (a plugin
    that offers none keeps its hook's schedules).

Why this module is long: it is the plugin author's reference; each hook's
contract, arguments, results and failures are written next to its signature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from umahub.plugin.markers import hookspec

if TYPE_CHECKING:
    import tvm

    from umahub.plugin.accelerator import Accelerator
    from umahub.plugin.context import CompileContext, CostContext
    from umahub.plugin.tuning import TuningSpace


# -------------------------------------------------------------------------
# Discovery: what the plugin brings
# -------------------------------------------------------------------------


@hookspec
def umahub_accelerators() -> list[Accelerator]:
    """Declare the accelerators (target_archs) this plugin provides.

    Called once per plugin, when a :class:`umahub.Hub` loads it, before any
    other hook. Accelerator names are global: of two plugins that declare one
    name, the later in plugin order fails to load (``umahub plugins`` shows
    it as failed, naming the other; ``disable`` in ``[tool.umahub]`` chooses
    between the two).

    :return: a list of :class:`~umahub.plugin.Accelerator`; an empty list (or
        ``None``) for a plugin that only adds passes or schedules to other
        plugins' accelerators. A hook that raises or returns anything else
        makes the plugin fail to load: it is skipped with a warning, or stops
        the hub with a :class:`~umahub.errors.PluginLoadError` in ``strict``
        mode.

    Example::

        @hookimpl
        def umahub_accelerators():
            return [Accelerator(
                "dsp_cpu", codegen="c", instances=2,
                memory=[MemoryPool("dsp.tcm", 64 * 1024, copy="sync")],
            )]
    """


# -------------------------------------------------------------------------
# Partition: what each accelerator claims
# -------------------------------------------------------------------------


@hookspec
def umahub_patterns(accelerator: Accelerator) -> list[Any] | None:
    """Return the operator patterns ``accelerator`` can take.

    Called once per accelerator, while the placement is planned, for every
    implementation in hook order; the patterns of all implementations are
    taken, in that order. Accelerators claim operators in ``priority`` order;
    the first claimant of an operator wins and the host takes the rest.
    Within one accelerator, patterns are tried in the order given: put the
    larger ones first. A failure of this hook (an exception, a malformed
    pattern, ``hook-timeout``) is the accelerator's: it claims nothing in
    this compile (or, with ``on-error = "error"``, the compile stops).

    :param accelerator: the accelerator whose patterns are asked for.
    :return: ``None`` when ``accelerator`` is not this plugin's, else a list of
        patterns, each either a ``tvm.relax.transform.FusionPattern`` or a tuple
        ``(name, pattern[, annotations[, check]])`` as
        ``tvm.relax.transform.FuseOpsByPattern`` takes them. ``name`` must be
        ``"<accelerator>.<what>"`` (``"npu.matmul"``); ``check`` receives a
        ``tvm.relax.transform.PatternCheckContext`` and returns True to take
        the match, or False to reject a match it cannot handle (a shape too
        big for its memory, a stride it does not support): the operator then
        stays with the next claimant or the host, never a crash. To say why,
        it returns ``Refusal("reason")`` instead of False (it is
        false as well): when a user pinned the operator to this accelerator,
        the warning that the pin cannot be honoured quotes the reason.

    Marked ``@umahub.hookimpl(accelerator=...)``, it is called for those
    accelerators only, and need not take ``accelerator``.

    Example::

        from umahub.plugin import Refusal, hookimpl, human_size, match_bytes, op

        def fits(ctx):
            need = match_bytes(ctx)
            if need > 16 * 1024:
                return Refusal(f"its tensors take {human_size(need)}, over 16 KiB")
            return True

        @hookimpl(accelerator="dsp_cpu")
        def umahub_patterns():
            return [("dsp_cpu.relu", op("relax.nn.relu"), {}, fits)]
    """


# -------------------------------------------------------------------------
# Placement by cost: what a candidate group costs
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def umahub_cost(
    accelerator: Accelerator, function: tvm.relax.Function, context: CostContext
) -> float | None:
    """Estimate the seconds one candidate group of operators takes on ``accelerator``.

    Called only when placement is by cost (``priority = "auto"`` in
    ``[tool.umahub]``, ``hub.compile(mod, placement="auto")``): once per
    distinct group that ``accelerator``'s patterns match (equal groups, same
    operators and shapes, are asked once), in hook order. Stops at first
    non-None result. When every implementation returns ``None``, umahub
    measures: it builds the group alone on the accelerator and on the host,
    times both on this machine, and keeps the result on disk
    (:mod:`umahub.auto.cache`). A vendor with a cost model (or a simulator of
    a board that is not here) implements it; the host's side is always
    measured.

    :param accelerator: the accelerator the group would run on.
    :param function: the group alone, as a Relax function named ``main``:
        its inputs are the parameters, its weights bound as constants.
    :param context: a :class:`umahub.CostContext`: the group's operators
        (FLOPs, bytes), the patterns that matched, the config, the target,
        the accelerator's backend options (``context.options``).
    :return: ``None`` (no estimate: the next implementation, then a
        measurement), or the seconds of one call on one instance, copies in and
        out of the accelerator left out (umahub adds them from each pool's
        ``bandwidth``, or measures them). Anything but a finite number >= 0 is
        a plugin failure: a warning naming the plugin (an error with
        ``on-error = "error"``), and the group is measured instead.

    Example::

        @hookimpl(accelerator="npu")
        def umahub_cost(context):
            return context.flops / 2e12  # 2 TFLOP/s, whatever the shape
    """


# -------------------------------------------------------------------------
# Lowering: Relax to TIR, schedule (S-TIR), TIR passes (NS-TIR)
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def umahub_relax_to_tir(
    accelerator: Accelerator, function: tvm.relax.Function, context: CompileContext
) -> tvm.IRModule | None:
    """Lower one partition from Relax to TIR.

    Called once per partition placed on ``accelerator``, in ``lowering-order``.
    Stops at first non-None result. Called inside ``with target:``, the
    ``tvm.target.Target`` the model is built for (``context.target``, else this
    machine's): TVM's lowering, and :func:`umahub.plugin.default_relax_to_tir`'s
    quantized kernels, choose by it.

    :param accelerator: the accelerator the partition is placed on.
    :param function: the partition, a Relax function holding the composite
        function(s) its patterns matched; its parameters are the partition's
        inputs (weights included).
    :param context: the compile context; ``context.symbol`` is the name the
        PrimFunc must carry.
    :return: ``None`` for the default lowering (``LegalizeOps`` and fusion into
        one PrimFunc), else a ``tvm.IRModule`` whose PrimFunc named
        ``context.symbol`` takes the partition's inputs followed by its output
        buffer (destination-passing style).

    Marked ``@umahub.hookimpl(accelerator=...)``, it is called for partitions
    on those accelerators only.

    Example::

        @hookimpl(accelerator="my_accel")
        def umahub_relax_to_tir(function, context):
            return tvm.IRModule({context.symbol: my_kernel_primfunc(function)})
    """


@hookspec
def umahub_schedule(
    accelerator: Accelerator, schedule: tvm.s_tir.Schedule, context: CompileContext
) -> str | None:
    """Schedule one partition's TIR (S-TIR: loops, tiles, caches, vectors).

    Called for every implementation, in hook order, once per partition placed
    on ``accelerator``, after :func:`umahub_relax_to_tir`. Implementations
    change ``schedule`` in place (``split``, ``reorder``, ``vectorize``,
    ``parallel``...); the scheduled module goes on to the TIR passes.

    :param accelerator: the accelerator the partition is placed on.
    :param schedule: a ``tvm.s_tir.Schedule`` over the partition's TIR module,
        working on the PrimFunc named ``context.symbol`` (so
        ``schedule.get_sblock("root")`` needs no ``func_name``).
    :param context: the compile context; ``context.pool_free`` tells how much of
        the accelerator's memory pool is left for tiles, ``context.weights``
        which parameters the model passes as constants.
    :return: ``None``, or a short description of what was done (``"tiled
        64x64, vectorized x16"``), shown in the report. Anything else is a
        failure of the plugin's (its partition goes to the host): a returned
        ``IRModule`` or ``Schedule`` in particular, the sign of work done on a
        copy, which umahub never sees.

    Marked ``@umahub.hookimpl(accelerator=...)``, it is called for partitions
    on those accelerators only.

    **Weights in the kernel's layout.** A kernel that reads a weight in
    another layout than the model's (panels, channel blocks) should not pack
    it at every inference. For a parameter in ``context.weights``, make the
    packing a block at the root annotated ``meta_schedule.layout_rewrite_preproc``
    (TVM's convention; :func:`umahub.plugin.pack_weight` does it): umahub then
    runs that block once at compile time, and the built model holds the
    packed weight, which the kernel receives as that parameter. The report
    lists it under the partition (``packed at compile time: weight 1 (64x32
    -> 2x64x16)``); verification still compares against the host on the
    model's own weight.

    Example::

        @hookimpl(accelerator="dsp_cpu")
        def umahub_schedule(schedule):
            for block in schedule.get_child_blocks(schedule.get_sblock("root")):
                *_, inner = schedule.get_loops(block)
                schedule.vectorize(inner)
            return "vectorized"
    """


@hookspec
def umahub_tir_passes(
    accelerator: Accelerator, phase: int, context: CompileContext
) -> list[Any] | None:
    """Add TIR passes (NS-TIR) at one of the four phases of TIR lowering.

    Called for every implementation, per partition and per phase, when the
    partition's TIR is built. The phases are UMA's ``TIR_PHASE_0..3``; they cut
    TVM's default ``s_tir`` pipeline (see ``umahub.compiler.tir_phases``):

    * phase 0: before lowering starts, on the scheduled TIR with its blocks;
    * phase 1: after blocks are lowered and buffers flattened (``FlattenBuffer``);
    * phase 2: after loops are vectorized, unrolled and simplified;
    * phase 3: just before the packed API is made (``MakePackedAPI``).

    :param accelerator: the accelerator the partition is placed on.
    :param phase: 0, 1, 2 or 3.
    :param context: the compile context.
    :return: ``None`` or a list of ``tvm.transform.Pass`` (module or
        ``prim_func_pass``) run in list order at that phase, after the passes
        of plugins earlier in hook order.

    For an accelerator with a device of its own (codegen ``"device"``), no TVM
    lowering makes its program: umahub runs the passes itself, phase after
    phase, on the scheduled S-TIR, and gives the result to
    :func:`umahub_codegen`. That is where a device's DMA, dependency tokens and
    double buffering go (the bundled simnpu's ``umahub_simnpu.passes``). After
    them, the tiles allocated in the accelerator's on-chip buffers'
    scopes (``Accelerator(buffers=...)``) are added up per scope and checked
    against the capacities.

    Marked ``@umahub.hookimpl(accelerator=...)``, it is called for partitions
    on those accelerators only.

    Example::

        @hookimpl(accelerator="vanilla_accel")
        def umahub_tir_passes(phase):
            return [conv2d_to_extern()] if phase == 0 else None
    """


# -------------------------------------------------------------------------
# Codegen
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def umahub_codegen(
    accelerator: Accelerator, module: tvm.IRModule, context: CompileContext
) -> Any | None:
    """Generate the code of one partition.

    Called once per partition placed on ``accelerator``, after the TIR passes
    were registered in the pipeline. Stops at first non-None result.

    :param accelerator: the accelerator the partition is placed on.
    :param module: the scheduled TIR module of the partition (not yet lowered
        by the TIR pipeline: a codegen that builds it with ``tvm.tirx.build``
        passes ``pipeline=context.tir_pipeline`` to run the phases).
    :param context: the compile context.
    :return: ``None`` for the default codegen named by ``accelerator.codegen``
        (``"c"``: TVM's C codegen with ``c_includes`` on top, ``c_sources``
        compiled and linked at export; ``"llvm"``: LLVM), else a TVM runtime
        module that exports a function named ``context.symbol`` taking the
        partition's inputs and then its output. For an accelerator with a
        device of its own (``Accelerator(runtime=...)``, codegen ``"device"``):
        a :class:`umahub.plugin.DeviceProgram` (there is no default), the
        program its runtime loads and executes on the partition's buffers,
        inputs in order (the constant ones, ``context.weights``, resident on
        the device from load on) and then outputs; umahub calls it from the
        host through a stub and carries it in the exported library (see
        :mod:`umahub.plugin.device`). Give its ``timing``
        (:class:`umahub.plugin.ProgramTiming`, from your cycle model) and the
        report shows the cycles per partition and draws the device's modules.

    Marked ``@umahub.hookimpl(accelerator=...)``, it is called for partitions
    on those accelerators only.

    A codegen that builds LLVM builds for ``context.target`` when it is set
    (a cross build: the model runs on a board of another architecture), and
    for this machine as it likes when it is None. C is compiled by the
    compile's C compiler at export, whatever the target.

    Example::

        @hookimpl(accelerator="my_accel")
        def umahub_codegen(module, context):
            target = context.target or tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
            return tvm.tirx.build(module, target=target, pipeline=context.tir_pipeline)

    A device's::

        @hookimpl(accelerator="my_npu")
        def umahub_codegen(module, context):
            program = my_npu_compiler.emit(module[context.symbol])  # bytes
            return up.DeviceProgram(program, {"format": 1})
    """


# -------------------------------------------------------------------------
# Tuning: what ``umahub tune`` may search
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def umahub_tuning_space(
    accelerator: Accelerator, function: tvm.tirx.PrimFunc, context: CompileContext
) -> TuningSpace | None:
    """Offer a search space for one partition's schedule, for ``umahub tune``.

    Called only by ``umahub tune MODEL`` (:meth:`umahub.Hub.tune`), once per
    partition placed on ``accelerator``, after :func:`umahub_relax_to_tir`;
    never by a compile. Stops at first non-None result. ``umahub tune`` draws
    candidates from the space, builds each as the compile builds the
    partition (:func:`umahub_tir_passes`, :func:`umahub_codegen`), measures
    them beside the schedule of :func:`umahub_schedule` (on this machine or on
    the boards of a tracker) and writes the verdict in the tuning database. A
    compile with that database (``tuning-database`` in ``[tool.umahub]``)
    replays the tuned schedule in place of calling :func:`umahub_schedule`,
    only where it measured faster; the report says per partition which
    schedule was used and why.

    :param accelerator: the accelerator the partition is placed on.
    :param function: the partition's PrimFunc, as :func:`umahub_schedule` would
        be given it (named ``"main"`` here): what the kernel computes, for the
        plugin to decide whether it has a space for it.
    :param context: the compile context of the partition.
    :return: ``None`` (no space: the partition keeps its hook's schedule), or a
        :class:`umahub.plugin.TuningSpace`: a design space written as a
        schedule with sampled decisions, or MetaSchedule's schedule rules.
        Anything else, or a space that raises on every draw, is a failure of
        the plugin's, which ``umahub tune`` reports; the partition keeps its
        hook's schedule.

    Kernels of an accelerator with a device of its own
    (``Accelerator(runtime=...)``) are not tuned: the runners measure in a
    process of their own, where the device's runtime is not loaded.

    Marked ``@umahub.hookimpl(accelerator=...)``, it is called for partitions
    on those accelerators only.

    Example (the tile of a matmul drawn from its divisors)::

        @hookimpl(accelerator="my_accel")
        def umahub_tuning_space(function):
            def space(schedule):
                block = schedule.get_sblock("matmul")
                i, j, k = schedule.get_loops(block)
                tile = schedule.get(schedule.sample_categorical([8, 16, 32], [1 / 3] * 3))
                schedule.split(j, factors=[None, int(tile)])
                ...

            return up.TuningSpace(schedule=space, description="column tiles")
    """


# -------------------------------------------------------------------------
# The host: what no accelerator took
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def umahub_host_schedule(schedule: tvm.s_tir.Schedule, target: tvm.target.Target) -> str | None:
    """Schedule one function of the host's part: operators no accelerator took.

    The host's part of the model is fused as TVM's CPU pipeline fuses it
    (``LegalizeOps``, ``FuseOps``, ``FuseTIR``: an elementwise chain, a
    softmax, a layer norm become one PrimFunc each); then this hook is called
    once per PrimFunc, in hook order. Stops at first non-None result. When
    every implementation returns ``None``, umahub's own
    schedules run (:mod:`umahub.host.schedules`: TVM's ``dlight`` CPU rules
    for reductions, parallel and vectorized loops for the rest). A plugin for
    a CPU (or a vendor of a better CPU backend) implements it to replace them
    for the functions it knows, and returns ``None`` for the others.

    :param schedule: a ``tvm.s_tir.Schedule`` over one host PrimFunc, named
        ``"main"`` in ``schedule.mod``; change it in place.
    :param target: the host's target (``llvm`` with the CPU's features, or
        a cross build's, ``llvm -mtriple=aarch64-linux-gnu``): the vector
        width is ``tvm.target.codegen.llvm_get_vector_width(target)`` bits.
    :return: ``None`` (not handled: the next implementation, then umahub's
        default), or a short name of what was done (``"softmax row kernel"``),
        counted in the report's ``host_schedules``. A schedule left half done
        by an implementation that raises is discarded: the function is
        scheduled as if the hook had returned ``None``, and the failure is a
        warning naming the plugin.

    Not called for accelerators, so it takes no ``accelerator`` and cannot
    be marked with one.

    Example::

        @umahub.hookimpl
        def umahub_host_schedule(schedule, target):
            block = schedule.get_sblock("T_softmax_norm", func_name="main")
            ...
            return "softmax row kernel"
    """
