"""The host's own kernels: what runs on the CPU when no accelerator takes an operator.

Lowering (:mod:`~umahub.host.lowering`), schedules for elementwise, row,
pooling, matrix and convolution kernels (:mod:`~umahub.host.schedules`,
:mod:`~umahub.host.matmul`, :mod:`~umahub.host.conv`), and the passes that
make the host's and accelerators' code fast: stack scratch buffers, Relax's
memory plan kept apart by device, weights packed and folded at compile time,
the weights' run-time checks left out (:mod:`~umahub.host.weight_checks`).
"""
