"""umahub's converters of ATen operators (umahub.frontends.torch_ops): arithmetic in
PyTorch's result types, division with its rounding, and ``Tensor.unfold``,
against PyTorch itself.

Found on timm's XCiT (a float tensor floor-divided by a Python int: TVM's
frontend refused it) and HaloNet (``unfold``: missing); integer tensors with
float numbers (``x * 0.5``, ``torch.div(x, 2)``) were silent wrong answers of
TVM's frontend, computed in integers. Each case imports a
one-line module and runs it through plain ``tvm.compile`` (the import is what
is under test): PyTorch's values, type and shape exactly.

Slow (``-m slow``): needs PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install 'umahub[torch]'")


def _imported_run(f, x):
    import tvm
    from tvm import relax

    from umahub.frontends.torch_import import from_exported_program

    class Module(torch.nn.Module):
        def forward(self, x):
            return f(x)

    mod = from_exported_program(torch.export.export(Module(), (x,)))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x.numpy())).numpy(), f(x).numpy()


INTS = torch.arange(-7, 8, dtype=torch.int64).reshape(1, 15)
FLOATS = torch.linspace(-7, 7, 15).reshape(1, 15)


@pytest.mark.parametrize(
    ("f", "x"),
    [
        pytest.param(lambda x: torch.div(x, 2), INTS, id="ints-true-division-gives-floats"),
        pytest.param(lambda x: torch.div(x, 2.5), INTS, id="ints-by-a-float"),
        pytest.param(lambda x: torch.div(x, 2), FLOATS, id="floats-by-an-int"),
        pytest.param(lambda x: torch.div(x, 3, rounding_mode="floor"), INTS, id="ints-floor"),
        pytest.param(lambda x: torch.div(x, 3, rounding_mode="floor"), FLOATS, id="floats-floor"),
        pytest.param(lambda x: torch.div(x, 3, rounding_mode="trunc"), INTS, id="ints-trunc"),
        pytest.param(lambda x: torch.div(x, 3, rounding_mode="trunc"), FLOATS, id="floats-trunc"),
        pytest.param(
            lambda x: torch.div(x, x.flip(1).abs() + 1, rounding_mode="trunc"),
            INTS,
            id="ints-by-ints-trunc",
        ),
        pytest.param(
            lambda x: torch.div(x.to(torch.int32), x.float() + 100), INTS, id="int32-by-floats"
        ),
        pytest.param(lambda x: x * 0.5, INTS, id="ints-times-a-float"),
        pytest.param(lambda x: 1.5 - x, INTS, id="a-float-minus-ints"),
        pytest.param(lambda x: x % 2.5, INTS, id="ints-modulo-a-float"),
        pytest.param(
            lambda x: torch.clamp(x, min=-2.5, max=2.5), INTS, id="ints-clamped-by-floats"
        ),
        pytest.param(lambda x: x.abs() ** 0.5, INTS, id="ints-to-a-float-power"),
        pytest.param(lambda x: torch.where(x > 0, x, 0.5), INTS, id="where-ints-or-a-float"),
        pytest.param(lambda x: torch.sigmoid(x), INTS, id="sigmoid-of-ints"),
        pytest.param(lambda x: torch.exp(x.clamp(-3, 3)), INTS, id="exp-of-ints"),
        pytest.param(lambda x: (x > 0) * 2.5, INTS, id="bools-times-a-float"),
        pytest.param(lambda x: (x > 0) + 1, INTS, id="bools-plus-an-int"),
        pytest.param(lambda x: x.half() + x.float(), INTS, id="float16-plus-float32"),
        pytest.param(lambda x: x.unfold(1, 4, 3), FLOATS, id="unfold"),
        pytest.param(lambda x: x.unfold(-1, 15, 1), FLOATS, id="unfold-one-window"),
        pytest.param(
            lambda x: x.reshape(1, 3, 5).unfold(1, 2, 1).unfold(2, 3, 2),
            FLOATS,
            id="unfold-twice",
        ),
    ],
)
def test_the_import_gives_pytorchs_values_types_and_shapes(f, x):
    got, expected = _imported_run(f, x)
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
    np.testing.assert_array_equal(got, expected)


def test_an_unfold_along_an_axis_of_run_time_size_is_one_line():
    import umahub
    from umahub.frontends.torch_import import from_exported_program

    class Module(torch.nn.Module):
        def forward(self, x):
            return x.unfold(1, 4, 3)

    x = torch.randn(1, 15)
    dynamic = {"x": {1: torch.export.Dim("n", min=7, max=64)}}
    program = torch.export.export(Module(), (x,), dynamic_shapes=dynamic)
    with pytest.raises(umahub.UmahubError) as raised:
        from_exported_program(program)
    assert str(raised.value) == (
        "node 'unfold': Tensor.unfold along axis 1, whose size is known only at run time; "
        "umahub unfolds axes of static size (export with that size fixed)"
    )
