"""``umahub.plugin.compat``: the TVM names plugins need, on any apache-tvm from 0.25 to 0.27."""

from __future__ import annotations

import subprocess
import sys

import pytest

from umahub.plugin import compat


def test_importing_it_does_not_import_tvm():
    code = "import sys, umahub.plugin.compat; assert 'tvm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_public_name_resolves():
    for name in compat.__all__:
        assert getattr(compat, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        compat.Nope  # noqa: B018


def test_buffer_of_a_load_a_store_and_a_region():
    import tvm
    from tvm import tirx

    buf = tirx.decl_buffer((4, 8), "float32", name="A")
    i = tirx.Var("i", "int32")
    load = tirx.BufferLoad(buf, [i, 0])
    store = tirx.BufferStore(buf, load, [0, i])
    region = tirx.BufferRegion(buf, [tvm.ir.Range(0, 4), tvm.ir.Range(0, 8)])
    assert isinstance(load, compat.Load)
    assert isinstance(region, compat.Region)
    for node in (load, store, region):
        assert compat.buffer_of(node).same_as(buf)
    with pytest.raises(TypeError, match="is not a buffer load, store or region"):
        compat.buffer_of(i)
    assert compat.is_buffer(buf) and not compat.is_buffer(i)
    assert [v.same_as(i) for v in compat.vars_in(i * 2 + 1)] == [True]


def test_a_node_shared_by_two_parents_is_listed_each_time_it_occurs():
    from tvm import tirx

    buf = tirx.decl_buffer((4,), "float32", name="A")
    i = tirx.Var("i", "int32")
    load = tirx.BufferLoad(buf, [i])
    square = load * load  # one load object, read twice
    assert len(compat.nodes_in(square, compat.Load)) == 2
    assert sum(v.same_as(i) for v in compat.vars_in(square)) == 2
    store = tirx.BufferStore(buf, square, [i])
    assert len(compat.nodes_in(store, compat.Load)) == 2
    assert len(compat.nodes_in(store, tirx.BufferStore)) == 1
    # an expression holds no statement (0.25 walks it inside a T.evaluate)
    assert compat.nodes_in(square, tirx.Stmt) == []


def test_param_buffers_data_pointer_and_linear_equations():
    from tvm import tirx
    from tvm.script import tirx as T

    @T.prim_func
    def func(a: T.Buffer((4,), "float32"), n: T.int32, b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i]

    a, n, b = compat.param_buffers(func)
    assert n is None and compat.is_buffer(a) and compat.is_buffer(b)
    assert compat.data_pointer(a) is not None
    assert compat.points_to(compat.data_pointer(a), a)
    assert compat.points_to(a.data, a)
    assert not compat.points_to(compat.data_pointer(b), a)
    assert not compat.points_to(tirx.address_of(tirx.BufferLoad(a, [1])), a)
    x = tirx.Var("x", "int32")
    assert [int(c) for c in compat.detect_linear_equation(x * 3 + 2, [x])] == [3, 2]


def test_no_code_builds_a_relax_type_from_tvm_relax_itself():
    """0.25's ``relax.TensorType``/``TupleType`` are older, shape-less classes: a tensor's
    type is built with the shim's (``umahub._tvm``, re-exported here), on every TVM."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"\brelax\.(TensorType|TupleType)\(")
    found = [
        f"{path.relative_to(root)}:{n}"
        for top in ("src", "plugins", "tests")
        for path in (root / top).rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
