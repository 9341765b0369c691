"""torchvision's classification models through torch.export and umahub, against PyTorch eager.

Each model is built with random weights (seeded), in eval mode, exported with
``torch.export.export`` on one small input, compiled by a hub with the three
bundled plugins (npu, vanilla, dsp), run, and compared with PyTorch eager on
the same input. The error measure is the relative error
``max|a - b| / max|b|`` (``a`` umahub's output, ``b`` PyTorch's); it must stay
under :data:`TOLERANCE`. When it does not, the same module compiled by plain
``tvm.compile`` is measured too, so that the failure says whether TVM itself
is off or umahub is.

Slow (``-m slow``, ``tox -e slow``): about a minute or two per model here.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install 'umahub[torch]'")

TOLERANCE = 1e-4


def _import_torchvision():
    """torchvision, also when its compiled ops do not load.

    PyPI's torchvision wheel is built against PyTorch with CUDA; next to the
    CPU build of PyTorch its C extension does not load, and ``import
    torchvision`` then fails registering fake kernels for ``torchvision::nms``
    and ``qnms``. The models are plain Python: declaring those two operators'
    schemas is enough to import them.
    """
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("needs torchvision: pip install 'umahub[torch]'", allow_module_level=True)
    try:
        import torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _import_torchvision.library = library  # keep the definitions alive
        import torchvision
    return torchvision


tv = _import_torchvision()


def _tiny_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128
    )
    # torchvision starts the classifier head at zero (fine-tuning init): every
    # output would be 0 and nothing compared. Random weights, as in the others.
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    torch.nn.init.normal_(model.heads.head.bias, std=0.02)
    return model


# name -> (constructor, input shape)
MODELS = {
    "mobilenet_v2": (lambda: tv.models.mobilenet_v2(), (1, 3, 64, 64)),
    "mobilenet_v3_small": (lambda: tv.models.mobilenet_v3_small(), (1, 3, 64, 64)),
    "efficientnet_b0": (lambda: tv.models.efficientnet_b0(), (1, 3, 64, 64)),
    "vit_tiny": (_tiny_vit, (1, 3, 32, 32)),
    "resnet18": (lambda: tv.models.resnet18(), (1, 3, 64, 64)),
    "squeezenet1_0": (lambda: tv.models.squeezenet1_0(), (1, 3, 64, 64)),
    "shufflenet_v2_x0_5": (lambda: tv.models.shufflenet_v2_x0_5(), (1, 3, 64, 64)),
    "regnet_y_400mf": (lambda: tv.models.regnet_y_400mf(), (1, 3, 64, 64)),
    "mnasnet0_5": (lambda: tv.models.mnasnet0_5(), (1, 3, 64, 64)),
}


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """``max|actual - expected| / max|expected|``."""
    actual, expected = np.asarray(actual, "float64"), np.asarray(expected, "float64")
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def _plain_tvm(mod, x: np.ndarray) -> np.ndarray:
    import tvm
    from tvm import relax

    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


@pytest.fixture(scope="module")
def hub():
    import umahub

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return umahub.Hub(config={"plugins": ["npu", "vanilla", "dsp"]}, project_config=False)


@pytest.mark.parametrize("name", list(MODELS))
def test_torchvision_model_matches_pytorch(name, hub):
    from umahub.frontends import to_relax

    torch.set_flush_denormal(True)  # random weights make denormals: eager would crawl
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x).numpy()
        program = torch.export.export(model, (x,))
    assert np.abs(expected).max() > 0, f"{name}: PyTorch's output is all zeros"
    mod = to_relax(program)
    compiled = hub.compile(mod)
    actual = compiled.run(x.numpy())
    devices = {o.device.split(":")[0] for o in compiled.report.placement}
    assert devices - {"host"}, f"{name}: nothing was placed on an accelerator"
    error = relative_error(actual, expected)
    print(f"{name}: relative error {error:.2e}, devices {sorted(devices)}")
    if not error < TOLERANCE:  # NaN fails too
        plain = relative_error(_plain_tvm(mod, x.numpy()), expected)
        pytest.fail(
            f"{name}: relative error {error:.2e} against PyTorch (limit {TOLERANCE:.0e}); "
            f"plain tvm.compile of the same module: {plain:.2e}"
        )
