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


def relax_model(name: str) -> tuple[Any, list[Any]]:
    """(Relax module, numpy inputs) of a zoo or torchvision model."""
    import umahub.models as zoo

    if name in zoo.names():
        return zoo.get(name), list(zoo.inputs(name))
    import torch

    from umahub.frontends import to_relax

    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    module = getattr(torchvision_models(), name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return to_relax(torch.export.export(module, (x,))), [x.numpy()]
