"""Boards: running an exported library over TVM's RPC, the board's server, and latency.

:mod:`~umahub.remote.rpc` is the host's side (``umahub.remote(...)``),
:mod:`~umahub.remote.board` the board's (``python -m umahub.remote.board``),
:mod:`~umahub.remote.bench` the numbers of ``umahub bench``.
"""
