"""The benchmark models as Relax modules with their inputs: the zoo's, and torchvision's
architectures with random weights (seed 0) through ``torch.export``."""

from __future__ import annotations

import sys
from typing import Any

ZOO = ["resnet18", "mobilenetv2", "bert", "bert2"]
TORCHVISION = ["resnet50", "efficientnet_b0", "mobilenet_v3_small", "vit_b_16", "squeezenet1_1"]


def torchvision_models() -> Any:
    """``torchvision.models``, also next to a CPU torch that PyPI's CUDA torchvision
    does not load with (its ops declared here)."""
    import torch

    try:
        import torchvision
    except RuntimeError:  # PyPI's CUDA torchvision next to the CPU torch: declare its ops
        for m in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[m]
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        torchvision_models.keep = lib  # type: ignore[attr-defined]
        import torchvision
    return torchvision.models


def random_torchvision(name: str) -> tuple[Any, Any]:
    """(module in eval mode, input) of torchvision's ``name`` with random weights
    (seed 0), batch norms calibrated on random images (seed 2), and a random
    image (seed 1).

    The outputs are of order one, so that comparing engines' outputs checks
    something: torchvision starts some classifiers at zero (ViT's head, for
    fine-tuning; every output would be 0 whatever the network computes) or
    with a small spread (MobileNetV3's, std 0.01); a linear layer whose
    weights spread less than half of ``1/sqrt(fan_in)`` gets that spread
    (variance kept from its input to its output).
    """
    import torch

    torch.manual_seed(0)
    module = getattr(torchvision_models(), name)(weights=None).eval()
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            spread = 1.0 / layer.in_features**0.5
            if float(layer.weight.detach().std()) < spread / 2:
                torch.nn.init.normal_(layer.weight, std=spread)
                if layer.bias is not None:
                    torch.nn.init.normal_(layer.bias, std=0.02)
    _calibrate_norms(
        module, torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    )
    return module, torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))


def _calibrate_norms(module: Any, images: Any) -> None:
    """Each batch norm's running statistics measured on ``images``, as one training step would.

    With random weights and torchvision's initial statistics (mean 0, variance
    1), each block scales its input by whatever its random weights happen to
    give, and deep networks end far from 1: efficientnet_b0's outputs were of
    order 1e-20, where a comparison of engines' outputs checks nothing and
    denormals decide the speed. Normalized by what they really see, every
    layer's output is of order one, as in a trained network.
    """
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a plain average over the batches seen: here, one
        norm.train()  # only the norms: dropout and stochastic depth stay as in inference
    with torch.no_grad():
        module(images)
    module.eval()


def relax_model(name: str) -> tuple[Any, list[Any]]:
    """(Relax module, numpy inputs) of a zoo or torchvision model."""
    import umahub.models as zoo

    if name in zoo.names():
        return zoo.get(name), list(zoo.inputs(name))
    import torch

    from umahub.frontends import to_relax

    torch.set_flush_denormal(True)
    module, x = random_torchvision(name)
    return to_relax(torch.export.export(module, (x,))), [x.numpy()]
