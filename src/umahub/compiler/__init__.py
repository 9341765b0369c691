"""The compiler: a Relax module through the stages of the pipeline to a compiled model.

:mod:`~umahub.compiler.pipeline` runs the stages in order
(:mod:`~umahub.compiler.stages`: plan, partition, memory, lower, build,
verify), each reading what earlier ones wrote to the
:mod:`~umahub.compiler.compilation` and adding its own. Around them: placement
(:mod:`~umahub.compiler.placement`), composite functions, virtual devices, the
default Relax-to-TIR lowering, the TIR phases where plugins' passes run,
codegen, and umahub as a pipeline of ``tvm.compile``
(:mod:`~umahub.compiler.relax_pipeline`).
"""
