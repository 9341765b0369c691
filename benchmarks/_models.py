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
    (seed 0) and a random image (seed 1).

    torchvision starts some classifiers at zero (ViT's head, for fine-tuning):
    every output would then be 0 whatever the network computes, and a
    comparison of engines' outputs would check nothing. Such a layer gets
    small random weights too.
    """
    import torch

    torch.manual_seed(0)
    module = getattr(torchvision_models(), name)(weights=None).eval()
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear) and not layer.weight.detach().any():
            torch.nn.init.normal_(layer.weight, std=0.02)
            if layer.bias is not None:
                torch.nn.init.normal_(layer.bias, std=0.02)
    return module, torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))


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
