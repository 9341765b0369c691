"""Where a model comes from: a Relax module, PyTorch, ONNX, the zoo, a TVMScript file.

:func:`to_relax` is what ``Hub.compile`` and ``Hub.explain`` call first; it
takes

* a Relax ``tvm.IRModule`` with a ``main`` (returned as it is);
* a ``torch.export.ExportedProgram``, through TVM's
  ``from_exported_program`` (PyTorch is the optional extra ``umahub[torch]``);
* an ``onnx.ModelProto``, through TVM's ``from_onnx`` (the extra
  ``umahub[onnx]``).

The PyTorch import first rewrites what TVM's frontend refuses or gets wrong
(:mod:`umahub.frontends.torch_rewrites`): a buffer the model writes (a KV
cache) becomes an input and an output of ``main``. Both imports bind the
weights as constants (``main`` takes the model's inputs only) and return a
single output as a tensor, not a 1-tuple. ``torch`` and ``onnx`` are imported
only when such a model is given.

:func:`load_model` is what ``umahub compile MODEL`` and ``umahub explain
MODEL`` call: a model-zoo name (``umahub.models.names()``), a ``.py`` file
holding a TVMScript ``IRModule`` (the module-level ``tvm.IRModule`` with a
``main``; if there are several, the one named ``Module``, ``mod`` or
``model``), an ``.onnx`` file, or a ``.pt2`` file written by
``torch.export.save``.

Operator names
--------------

TVM's frontends (0.25-0.27) keep no names: every operator is bound to a
variable ``lv``, ``lv1``, ... and carries no span. umahub names each operator
(its span, and the variable it is bound to) after the source node it came
from, so that pins and the report speak the model's language (ONNX on every
supported TVM; PyTorch on apache-tvm 0.26 and 0.27: 0.25's PyTorch frontend
drops the spans, and names stay TVM's):

* ONNX: the node's ``name``, or its first output's name when the node is
  unnamed.
* PyTorch: the path of the ``torch.nn`` layer the operator belongs to, as in
  ``model.named_modules()``: ``layer1.0.conv1``, ``features.3.block.1``,
  ``encoder.layers.encoder_layer_0.self_attention``. A layer called twice (the
  ``relu`` of torchvision's ``BasicBlock``) names the operators of both calls.
  An operator written in a model's own ``forward`` (``out += identity``,
  ``torch.flatten(x, 1)``) is ``<module path>.<torch function>``, numbered
  from the second call of that function in that module: ``layer1.0.add``,
  ``layer1.0.add_1``; at the top, just ``flatten``. (Taken from the FX node's
  ``meta["nn_module_stack"]`` and ``meta["torch_fn"]``; a node without them
  keeps its FX name.) PT2E's quantize and dequantize calls keep their FX names
  (``quantize_per_tensor_1``, ``dequantize_per_channel``).
* ONNX nodes rewritten into QDQ form (``QLinearConv``, ...: see
  :mod:`umahub.frontends.onnx_quantized`): the float operator has the node's
  name, the quantize and dequantize around it ``<node>.quantize``,
  ``<node>.dequantize_<input>``.

When the importer turns one node into several Relax operators (ONNX's
``Gemm`` into ``permute_dims``, ``matmul``, ``add``; a convolution with bias
into ``conv2d`` and ``add``), all of them get the node's name: a pin by the
node's name places all of them, and the report shows one row per operator
with the same name and each its own op. A glob (``"layer1.*"``) pins a whole
block.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError
from umahub.frontends.files import load_model
from umahub.frontends.onnx_import import from_onnx
from umahub.frontends.torch_import import from_exported_program

__all__ = ["from_exported_program", "from_onnx", "load_model", "to_relax"]

ACCEPTED = (
    "a Relax tvm.IRModule with a 'main' function, a torch.export.ExportedProgram "
    "(torch.export.export(model, example_inputs)) or an onnx.ModelProto (onnx.load(path))"
)


# ---------------------------------------------------------------------------- dispatch


def _is_onnx_model(model: Any) -> bool:
    cls = type(model)
    return cls.__name__ == "ModelProto" and cls.__module__.split(".")[0] == "onnx"


def _is_exported_program(model: Any) -> bool:
    torch = sys.modules.get("torch")  # an ExportedProgram exists only if torch is imported
    export = getattr(torch, "export", None) if torch is not None else None
    cls = getattr(export, "ExportedProgram", None)
    return cls is not None and isinstance(model, cls)


def _is_torch_module(model: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def to_relax(model: Any) -> Any:
    """The Relax ``tvm.IRModule`` of ``model``, with its operators named (see the module doc).

    Args:
        model: a Relax ``tvm.IRModule`` (returned unchanged), a
            ``torch.export.ExportedProgram`` or an ``onnx.ModelProto``.

    Raises:
        UmahubError: ``model`` is none of these (the message names its type and
            what is accepted), or TVM's frontend could not import it.
    """
    import tvm

    if isinstance(model, tvm.IRModule):
        return model
    if _is_exported_program(model):
        return from_exported_program(model)
    if _is_onnx_model(model):
        return from_onnx(model)
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    hint = ""
    if _is_torch_module(model):
        hint = "; export the module first: torch.export.export(model.eval(), example_inputs)"
    elif isinstance(model, (str, Path)):
        hint = "; to load a file or a zoo model, use umahub.frontends.load_model(path)"
    raise UmahubError(f"cannot compile a {kind}: expected {ACCEPTED}{hint}")


# ---------------------------------------------------------------------------- naming
