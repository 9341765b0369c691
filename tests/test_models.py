"""The model zoo: names, lookup errors, signatures, numbers against numpy and PyTorch.

Building every model is cheap and runs by default; compiling is not, so only
``mlp`` and ``cnn`` are compiled by default, the full-size models under
``-m slow``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from tvm import relax

import umahub.models as zoo
from umahub._tvm import ret_type, type_of  # .ty/.ret_ty (0.26, 0.27) or struct info (0.25)
from umahub.errors import UnknownModelError

SMALL = ["mlp", "cnn"]
LARGE = ["resnet18", "mobilenetv2", "bert", "bert2"]


@functools.cache
def _compiled(name: str) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(zoo.get(name), target="llvm"), tvm.cpu())


def _run_zoo(name: str, arrays: list[np.ndarray]) -> np.ndarray:
    return _compiled(name)["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _run(mod: tvm.IRModule, arrays) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(np.asarray(a)) for a in arrays]).numpy()


# --- numpy references of the two small models (float64) ---------------------------------


def _conv3x3_same(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    # patches[n, c, y, x, dy, dx]
    patches = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return np.einsum("ncyxij,ocij->noyx", patches, w) + b.reshape(1, -1, 1, 1)


def _mlp_reference(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ w["fc1.weight"].T + w["fc1.bias"], 0)
    return h @ w["fc2.weight"].T + w["fc2.bias"]


def _cnn_reference(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h1 = np.maximum(_conv3x3_same(x, w["conv1.weight"], w["conv1.bias"]), 0)
    h2 = np.maximum(_conv3x3_same(h1, w["conv2.weight"], w["conv2.bias"]), 0)
    flat = (h1 + h2).reshape(1, -1)
    return flat @ w["fc.weight"].T + w["fc.bias"]


REFERENCES = {"mlp": _mlp_reference, "cnn": _cnn_reference}


# --- names and lookup ----------------------------------------------------------------------


def test_names_lists_the_zoo_smallest_first():
    floats = ["mlp", "cnn", "resnet18", "mobilenetv2", "bert", "bert2"]
    assert zoo.names() == floats + [f"{n}_int8" for n in floats]


def test_unknown_model_error_suggests_the_closest_name_and_lists_the_known():
    with pytest.raises(UnknownModelError) as info:
        zoo.get("resnet")
    assert str(info.value) == (
        "unknown model 'resnet' (did you mean 'resnet18'?); "
        "known: bert, bert2, bert2_int8, bert_int8, cnn, cnn_int8, mlp, mlp_int8, mobilenetv2, "
        "mobilenetv2_int8, resnet18, resnet18_int8"
    )


def test_unknown_model_error_is_a_lookup_error_without_suggestion_when_nothing_is_close():
    with pytest.raises(LookupError, match=r"^unknown model 'vgg16'; known: bert, "):
        zoo.get("vgg16")


@pytest.mark.parametrize(
    "lookup", [zoo.get, zoo.inputs, zoo.info, zoo.weights], ids=lambda f: f.__name__
)
def test_every_lookup_refuses_an_unknown_name(lookup):
    with pytest.raises(UnknownModelError, match="did you mean 'mlp'"):
        lookup("mpl")


# --- signatures and weights ----------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL + LARGE)
def test_main_takes_only_the_model_inputs_and_returns_the_declared_output(name):
    main = zoo.get(name)["main"]
    meta = zoo.info(name)
    assert [tuple(int(d) for d in type_of(p).shape) for p in main.params] == [
        t.shape for t in meta.inputs
    ]
    assert [type_of(p).dtype for p in main.params] == ["float32"] * len(meta.inputs)
    assert tuple(int(d) for d in ret_type(main).shape) == meta.output.shape
    assert ret_type(main).dtype == meta.output.dtype
    assert [a.shape for a in zoo.inputs(name)] == [t.shape for t in meta.inputs]
    assert all(a.dtype == np.float32 for a in zoo.inputs(name))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("mlp", 64 * 128 + 128 + 128 * 10 + 10),
        ("cnn", 3 * 8 * 9 + 8 + 8 * 8 * 9 + 8 + 2048 * 10 + 10),
        # torchvision's counts minus one parameter per batch-norm channel (folded into a bias)
        ("resnet18", 11_689_512 - 4_800),
        ("mobilenetv2", 3_504_872 - 17_056),
        # HuggingFace's BertLayer (bert-base)
        ("bert", 7_087_872),
        ("bert2", 2 * 7_087_872),
    ],
)
def test_info_counts_the_bound_parameters(name, params):
    assert zoo.info(name).num_params == params
    assert sum(w.size for w in zoo.weights(name).values()) == params


def test_weights_are_the_same_on_every_call():
    first, second = zoo.weights("cnn"), zoo.weights("cnn")
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])


def test_get_returns_a_module_whose_changes_do_not_reach_later_callers():
    mod = zoo.get("mlp")
    mod["extra"] = mod["main"].with_attr("global_symbol", "extra")
    assert [gv.name_hint for gv in zoo.get("mlp").get_global_vars()] == ["main"]
    assert zoo.get("mlp")["main"].same_as(mod["main"])


def test_inputs_are_seeded():
    np.testing.assert_array_equal(zoo.inputs("cnn", seed=3)[0], zoo.inputs("cnn", seed=3)[0])
    assert not np.array_equal(zoo.inputs("cnn", seed=3)[0], zoo.inputs("cnn", seed=4)[0])


def test_bert_mask_input_is_additive_with_the_last_28_positions_padding():
    hidden, mask = zoo.inputs("bert")
    assert hidden.shape == (1, 128, 768)
    assert mask.shape == (1, 1, 1, 128)
    assert (mask[..., :100] == 0).all()
    assert (mask[..., 100:] == -10000).all()


# --- numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL)
def test_small_model_compiled_by_tvm_matches_numpy(name):
    x = zoo.inputs(name, seed=1)
    expected = REFERENCES[name](
        {k: v.astype(np.float64) for k, v in zoo.weights(name).items()}, x[0].astype(np.float64)
    )
    got = _run_zoo(name, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _torch_outputs(name: str):
    torch = pytest.importorskip(
        "torch", reason="PyTorch is not installed (pip install 'umahub[torch]')"
    )
    from umahub.models import torch_zoo

    module, example = torch_zoo.torch_module(name)
    with torch.no_grad():
        expected = module(*example).numpy()
    return [t.numpy() for t in example], expected


def _assert_close_to_torch(got: np.ndarray, expected: np.ndarray):
    assert np.isfinite(expected).all()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def _check_zoo_against_torch(name: str):
    arrays, expected = _torch_outputs(name)
    _assert_close_to_torch(_run_zoo(name, arrays), expected)


def _check_from_torch_against_torch(name: str):
    arrays, expected = _torch_outputs(name)
    from umahub.models import torch_zoo

    _assert_close_to_torch(_run(torch_zoo.from_torch(name), arrays), expected)


@pytest.mark.parametrize("name", SMALL)
def test_small_model_compiled_by_tvm_matches_torch_on_the_same_weights(name):
    _check_zoo_against_torch(name)


@pytest.mark.parametrize("name", SMALL)
def test_small_model_imported_from_torch_by_tvm_matches_torch(name):
    _check_from_torch_against_torch(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_model_compiled_by_tvm_matches_torch_on_the_same_weights(name):
    _check_zoo_against_torch(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_model_imported_from_torch_by_tvm_matches_torch(name):
    _check_from_torch_against_torch(name)


def test_torch_zoo_without_torch_says_how_to_install_it(monkeypatch):
    import sys

    from umahub.models import torch_zoo

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"pip install 'umahub\[torch\]'"):
        torch_zoo.torch_module("mlp")
