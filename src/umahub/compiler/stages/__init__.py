"""The stages of a compile, one module each, in pipeline order.

=========  ====================================================================
stage      what it adds to the :class:`~umahub.compiler.compilation.Compilation`
=========  ====================================================================
plan       the pins and the planned patterns (``umahub_patterns``)
partition  the partitioned module, every operator's placement, one report per
           partition
memory     the lowering order, every pool's plan, each partition's need;
           partitions that do not fit fall back
lower      a runtime module per partition (``umahub_relax_to_tir``,
           ``umahub_schedule``, ``umahub_tir_passes``, ``umahub_codegen``)
build      the devices, the copies, the compiled and loaded model
verify     each partition's largest error against the host; wrong ones fall back
=========  ====================================================================

Each module has ``run(compilation)``; :mod:`umahub.compiler.pipeline` calls them in
order. A stage imports only from below (the compilation state, the IR helpers,
the context, the errors, the plugin-facing helpers), never another stage or
the hub: what a later stage needs travels in the compilation.
"""
