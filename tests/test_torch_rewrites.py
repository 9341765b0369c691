"""What umahub's PyTorch import fixes (umahub.frontends.torch_rewrites), one small module each.

Each module reproduces a pattern that PyTorch accepts and TVM's PyTorch
frontend refuses or gets wrong, the way the KV caches of ``transformers``'
decoders produce it; the import must give PyTorch's numbers (plain
``tvm.compile`` of the imported module: the import is what is under test).

Slow (``-m slow``): needs PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install 'umahub[torch]'")


def _run(mod, *arrays):
    """The imported module through plain tvm.compile: a list of numpy outputs."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.require(a, requirements="C")) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _import(program):
    from umahub.frontends.torch_import import from_exported_program

    return from_exported_program(program)


class _GrowingCache(torch.nn.Module):
    """A dynamic KV cache's first step: the cache starts as ``torch.tensor([])``."""

    def forward(self, keys):
        cache = torch.tensor([])
        return torch.cat([cache, keys], dim=-2) * 2


def test_an_empty_1d_tensor_concatenated_with_a_4d_one_is_left_out():
    keys = torch.randn(1, 2, 3, 4)
    program = torch.export.export(_GrowingCache(), (keys,))
    (out,) = _run(_import(program), keys.numpy())
    np.testing.assert_allclose(out, keys.numpy() * 2, rtol=1e-6)


class _Flagged(torch.nn.Module):
    def forward(self, x, use_cache=True):
        return x + 1 if use_cache else x - 1


def test_a_constant_input_is_dropped_and_its_value_used():
    x = torch.randn(2, 3)
    program = torch.export.export(_Flagged(), (x,), {"use_cache": False})
    mod = _import(program)
    assert len(mod["main"].params) == 1
    (out,) = _run(mod, x.numpy())
    np.testing.assert_allclose(out, x.numpy() - 1, rtol=1e-6)


def test_a_constant_input_with_a_symbolic_size_imports():
    """(The guards torch.export keeps with such a program are dropped too: transformers'
    dynamic cache makes them fail, tests/test_language_models.py.)"""
    x = torch.randn(1, 5)
    n = torch.export.Dim("n", min=2, max=32)
    program = torch.export.export(
        _Flagged(), (x,), {"use_cache": True}, dynamic_shapes=({1: n}, None), strict=False
    )
    (out,) = _run(_import(program), np.ones((1, 7), "float32"))
    np.testing.assert_allclose(out, np.full((1, 7), 2.0), rtol=1e-6)


class _Layer:
    """A cache layer kept outside the module, as transformers' StaticCache keeps it."""

    def __init__(self):
        self.keys = torch.zeros(1, 2, 8, 4)


class _StaticCache(torch.nn.Module):
    """A static KV cache written at the given positions, registered as a buffer and
    reached through another object as well (what makes a non-strict export lift it twice)."""

    def __init__(self):
        super().__init__()
        self.layer = _Layer()
        self.register_buffer("key_cache", self.layer.keys, persistent=False)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, positions):
        self.layer.keys.index_copy_(2, positions, self.proj(x))
        return self.layer.keys.sum(dim=2)


def _static_reference(steps):
    torch.manual_seed(0)
    module = _StaticCache().eval()
    with torch.no_grad():
        return module, [module(x, p).numpy() for x, p in steps]


def test_a_written_buffer_becomes_an_input_and_an_output():
    steps = [
        (torch.randn(1, 2, 3, 4), torch.arange(3)),
        (torch.randn(1, 2, 1, 4), torch.tensor([3])),
    ]
    torch.manual_seed(0)
    module = _StaticCache().eval()
    n = torch.export.Dim("n", min=1, max=8)
    with torch.no_grad():
        program = torch.export.export(
            module, steps[0], dynamic_shapes=({2: n}, {0: n}), strict=False
        )
    mod = _import(program)
    assert [str(s) for s in mod["main"].attrs["umahub_state"]] == ["key_cache"]
    _, expected = _static_reference(steps)
    cache = np.zeros((1, 2, 8, 4), "float32")
    for (x, p), want in zip(steps, expected):
        out, cache = _run(mod, x.numpy(), p.numpy(), cache)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert np.count_nonzero(cache.any(axis=-1)) == 2 * 4  # positions 0-3 written, per head


def test_the_users_program_is_left_as_it_was():
    torch.manual_seed(0)
    module = _StaticCache().eval()
    x, p = torch.randn(1, 2, 1, 4), torch.tensor([0])
    with torch.no_grad():
        program = torch.export.export(module, (x, p), strict=False)
    before = str(program.graph_signature)
    _import(program)
    assert str(program.graph_signature) == before


class _PartialIndexPut(torch.nn.Module):
    """``x[:, :, pos] = v``: index_put with None for the leading dimensions."""

    def forward(self, cache, values, positions):
        return torch.ops.aten.index_put(cache, [None, None, positions], values)


def test_index_put_with_sliced_dimensions():
    cache, values = torch.zeros(2, 3, 6, 4), torch.randn(2, 3, 2, 4)
    positions = torch.tensor([4, 1])
    program = torch.export.export(_PartialIndexPut(), (cache, values, positions))
    (out,) = _run(_import(program), cache.numpy(), values.numpy(), positions.numpy())
    np.testing.assert_array_equal(out, _PartialIndexPut()(cache, values, positions).numpy())
