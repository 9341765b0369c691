"""Outside models: architectures nobody here wrote (timm's, torchvision's, Hugging
Face's), built with random weights (seed 0) and no download, at small inputs.

Each is ``(module in eval mode, input tensor)``. The random weights are made to
compute something: a parameter its library starts at zero or near it (a
ConvNeXt's layer scale of 1e-6, ConvNeXt-V2's global response norm, a
classifier initialised at zero for fine-tuning) would make its branch vanish,
and a comparison of engines' outputs would check nothing there; such a
parameter gets random values of order one tenth to one. :func:`build` also
divides the output by its own scale, so that every model's outputs are of
order one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _timm(name: str, size: int, **kwargs: Any) -> Callable[[], tuple[Any, tuple[int, ...]]]:
    def make() -> tuple[Any, tuple[int, ...]]:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs), (1, 3, size, size)

    return make


def _torchvision(name: str, size: int) -> Callable[[], tuple[Any, tuple[int, ...]]]:
    def make() -> tuple[Any, tuple[int, ...]]:
        from _models import torchvision_models

        return getattr(torchvision_models(), name)(weights=None), (1, 3, size, size)

    return make


def _hf_text(kind: str) -> Callable[[], tuple[Any, tuple[int, ...]]]:
    """A small Hugging Face text encoder of ``kind`` ("bert", "distilbert") on 64 token ids."""

    def make() -> tuple[Any, tuple[int, ...]]:
        import torch
        import transformers

        if kind == "bert":
            config = transformers.BertConfig(
                vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=1024, max_position_embeddings=128,
            )  # fmt: skip
            model = transformers.BertModel(config, add_pooling_layer=False)
        else:
            config = transformers.DistilBertConfig(
                vocab_size=1000, dim=256, n_layers=4, n_heads=4, hidden_dim=1024,
                max_position_embeddings=128,
            )  # fmt: skip
            model = transformers.DistilBertModel(config)

        class Encoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, ids: Any) -> Any:
                return self.model(input_ids=ids).last_hidden_state

        return Encoder(), (1, 64)

    return make


def _hf_vit() -> tuple[Any, tuple[int, ...]]:
    import torch
    import transformers

    config = transformers.ViTConfig(
        image_size=112, patch_size=16, hidden_size=192, num_hidden_layers=6,
        num_attention_heads=3, intermediate_size=768,
    )  # fmt: skip
    model = transformers.ViTModel(config, add_pooling_layer=False)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any) -> Any:
            return self.model(pixel_values=x).last_hidden_state

    return Encoder(), (1, 3, 112, 112)


#: name -> builder of (module, input shape); token ids where the shape is 2-D. What
#: ``outside_models.py`` runs by default (about 20 minutes on 2 cores).
MODELS: dict[str, Callable[[], tuple[Any, tuple[int, ...]]]] = {
    "poolformer_s12": _timm("poolformer_s12", 224),
    "convnext_atto": _timm("convnext_atto", 224),
    "convnextv2_atto": _timm("convnextv2_atto", 224),
    "coat_lite_tiny": _timm("coat_lite_tiny", 224),
    "efficientformer_l1": _timm("efficientformer_l1", 224),
    "mobilevit_xxs": _timm("mobilevit_xxs", 256),
    "levit_128s": _timm("levit_128s", 224),
    "ghostnet_100": _timm("ghostnet_100", 224),
    "regnetx_002": _timm("regnetx_002", 224),
    "tv_shufflenet_v2_x0_5": _torchvision("shufflenet_v2_x0_5", 224),
    "hf_bert": _hf_text("bert"),
    "hf_vit": _hf_vit,
}

#: More, by name only (``outside_models.py twins_svt_small``): slower to compile or run.
MORE: dict[str, Callable[[], tuple[Any, tuple[int, ...]]]] = {
    "twins_svt_small": _timm("twins_svt_small", 224),
    "swin_tiny": _timm("swin_tiny_patch4_window7_224", 224),
    "tv_regnet_y_400mf": _torchvision("regnet_y_400mf", 224),
    "tv_mnasnet0_5": _torchvision("mnasnet0_5", 224),
    "hf_distilbert": _hf_text("distilbert"),
    # each found a bug of its own: XCiT's division of a float tensor by a Python int and
    # HaloNet's unfold (the PyTorch import), Inception's 147x147 convolutions (the npu)
    "xcit_nano": _timm("xcit_nano_12_p16_224", 224),
    "halonet26t": _timm("halonet26t", 256),
    "inception_v3": _timm("inception_v3", 299),
}


def _lift_vanishing(module: Any) -> None:
    """Parameters that start at (or near) zero get random values in [0.1, 1)."""
    import torch

    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.numel() and float(p.abs().max()) < 1e-3 and not name.endswith("bias"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.9 + 0.1)


def build(name: str) -> tuple[Any, Any]:
    """(module in eval mode, input) of outside model ``name``: random weights (seed 0),
    vanishing parameters lifted, the output divided by its scale; a random image
    (seed 1) or random token ids."""
    import torch

    torch.manual_seed(0)
    torch.set_flush_denormal(True)
    module, shape = {**MODELS, **MORE}[name]()
    module = module.eval()
    _lift_vanishing(module)
    gen = torch.Generator().manual_seed(1)
    if len(shape) == 2:
        x = torch.randint(0, 1000, shape, generator=gen)
    else:
        x = torch.randn(*shape, generator=gen)
    with torch.no_grad():
        scale = float(module(x).abs().max())

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, inputs: Any) -> Any:
            return self.inner(inputs) * (1.0 / scale)

    return Scaled().eval(), x


def relax_of(name: str) -> tuple[Any, Any, Any]:
    """(Relax module, numpy input, PyTorch's output as numpy) of outside model ``name``."""
    import torch

    from umahub.frontends import to_relax

    module, x = build(name)
    with torch.no_grad():
        reference = module(x).numpy()
        exported = torch.export.export(module, (x,))
    return to_relax(exported), x.numpy(), reference
