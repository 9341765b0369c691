"""Boards: running an exported library over TVM's RPC, the board's server, and latency.

:mod:`~umahub.boards.rpc` is the host's side (``umahub.remote(...)``),
:mod:`~umahub.boards.board` the board's (``python -m umahub.boards.board``),
:mod:`~umahub.boards.bench` the numbers of ``umahub bench``.
"""
