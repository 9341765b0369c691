"""PT2E's quantized operators (``quantized_decomposed``) as Relax ``quantize`` / ``dequantize``.

A model quantized by PT2E (``torchao.quantization.pt2e.quantize_pt2e``:
``prepare_pt2e``, calibration, ``convert_pt2e``) and exported with
``torch.export`` carries its quantization as calls of
``quantized_decomposed.quantize_per_tensor`` / ``dequantize_per_tensor`` /
``quantize_per_channel`` / ``dequantize_per_channel`` (their ``.tensor``
overloads take the scale and zero point as tensors) around float operators:
the QDQ form umahub's quantized patterns match. TVM's importer knows none of
them; :func:`converters` gives it one for each:

* ``quantize_*(x, scale, zero_point, [axis,] quant_min, quant_max, dtype)`` is
  ``R.quantize(x, scale, zero_point, axis, dtype)`` (round half to even, as
  ``torch.round``), then ``R.clip`` to ``[quant_min, quant_max]`` where that is
  narrower than the dtype's range (a symmetric -127..127 weight);
* ``dequantize_*`` is ``R.dequantize`` to float32.

Scales and zero points that the program holds as constants (arguments of the
call, buffers, lifted constants) become Relax constants: float32 scales,
zero points of the quantized dtype. PyTorch computes ``round(x * (1 /
scale))`` and Relax ``round(x / scale)``; the two differ only where ``x /
scale`` lies within a float32 rounding of a half, rarely.

:func:`check_program` refuses a program whose constant parameters are
malformed, before anything is imported: a scale that is not positive and
finite, a zero point outside ``[quant_min, quant_max]``, a ``quant_min`` /
``quant_max`` outside the dtype's range, per-channel scales whose length is
not the channel count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from umahub.errors import UmahubError
from umahub.qparams import RANGES, SCALE_FIX, refuse, scale_problem, zero_point_problem

__all__ = ["check_program", "converters"]

NAMESPACE = "quantized_decomposed"
OPS = (
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "quantize_per_channel",
    "dequantize_per_channel",
)
OVERLOADS = ("default", "tensor", "tensor2")


def _op(node: Any) -> tuple[str, str] | None:
    """(operator, overload) of a ``quantized_decomposed`` call, or None."""
    if node.op != "call_function":
        return None
    target = str(node.target)  # "quantized_decomposed.quantize_per_tensor.default"
    parts = target.split(".")
    if len(parts) == 3 and parts[0] == NAMESPACE and parts[1] in OPS:
        return parts[1], parts[2]
    return None


def _dtype(value: Any) -> str:
    return str(value).replace("torch.", "")


class _Constants:
    """The values a program holds for its placeholders: parameters, buffers, constants."""

    def __init__(self, program: Any) -> None:
        self.values: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        state = {**dict(program.state_dict), **dict(getattr(program, "constants", {}))}
        for spec in program.graph_signature.input_specs:
            target = getattr(spec, "target", None)
            if target is not None and target in state:
                kind = str(spec.kind).rsplit(".", 1)[-1].lower().replace("_tensor", "")
                self.values[spec.arg.name] = state[target]
                self.where[spec.arg.name] = f"{kind} '{target}'"

    def get(self, arg: Any) -> tuple[Any, str] | None:
        """``arg``'s value as numpy and where it comes from; None when computed at run time."""
        import numpy as np

        name = getattr(arg, "name", None)
        if name is None:
            return np.asarray(arg), "argument"
        if name in self.values:
            return self.values[name].detach().cpu().numpy(), self.where[name]
        return None


def _args(node: Any, op: str) -> dict[str, Any]:
    """The call's arguments by name (the schema's, same in every overload)."""
    names = ["input", "scale", "zero_point"]
    if op.endswith("per_channel"):
        names = ["input", "scales", "zero_points", "axis"]
    names += ["quant_min", "quant_max", "dtype"]
    out = dict(zip(names, node.args))
    out.update(node.kwargs)
    return out


def check_program(program: Any) -> None:
    """Refuse a PT2E program whose constant quantization parameters are malformed.

    Raises:
        UmahubError: one line, ``node '<fx node>' (quantized_decomposed.<op>):
            <parameter> (<where>) <what is wrong>; <what to do>``.
    """
    import numpy as np

    constants: _Constants | None = None
    for node in program.graph.nodes:
        found = _op(node)
        if found is None:
            continue
        constants = constants or _Constants(program)
        op = f"{NAMESPACE}.{found[0]}"
        args = _args(node, found[0])
        dtype = _dtype(args.get("dtype"))
        qmin, qmax = args.get("quant_min"), args.get("quant_max")
        lo, hi = RANGES.get(dtype, (None, None))
        if isinstance(qmin, int) and isinstance(qmax, int) and lo is not None and hi is not None:
            if not lo <= qmin <= qmax <= hi:
                raise refuse(
                    node.name, op,
                    f"quant_min..quant_max {qmin}..{qmax} is not a range within {dtype}'s "
                    f"{lo}..{hi}: quantize the model again with a quantizer for {dtype}",
                )  # fmt: skip
        per_channel = found[0].endswith("per_channel")
        s_name, z_name = ("scales", "zero_points") if per_channel else ("scale", "zero_point")
        scale = constants.get(args.get(s_name))
        if scale is not None:
            problem = scale_problem(scale[0])
            if problem:
                raise refuse(node.name, op, f"{s_name} ({scale[1]}) {problem}; {SCALE_FIX}")
        zp = constants.get(args.get(z_name)) if args.get(z_name) is not None else None
        if zp is not None and isinstance(qmin, int) and isinstance(qmax, int):
            problem = zero_point_problem(zp[0], dtype, qmin, qmax)
            if problem:
                problem = problem.replace(f"{dtype}'s range", "quant_min..quant_max")
                raise refuse(
                    node.name, op,
                    f"{z_name} ({zp[1]}) {problem}; quantize the model again, or correct it",
                )  # fmt: skip
        if not per_channel:
            continue
        shape = getattr(getattr(args["input"], "meta", {}).get("val"), "shape", None)
        axis = int(args.get("axis", 0))
        for name, got in ((s_name, scale), (z_name, zp)):
            if got is None or shape is None or not -len(shape) <= axis < len(shape):
                continue
            if np.size(got[0]) != int(shape[axis]):
                raise refuse(
                    node.name, op,
                    f"{name} ({got[1]}) has {np.size(got[0])} values, but axis {axis} of "
                    f"'{args['input'].name}' has {int(shape[axis])} channels: give one per channel",
                )  # fmt: skip


def converters(program: Any) -> dict[str, Callable]:
    """TVM ``custom_convert_map`` entries for PT2E's operators (see the module doc).

    Keyed as TVM's importer looks converters up, by the overload's name
    (``"quantize_per_tensor.default"``); each refuses an operator of another
    namespace of that name (``aten.quantize_per_tensor``).
    """
    constants = _Constants(program)

    def convert(node: Any, importer: Any) -> Any:
        from tvm import relax

        found = _op(node)
        if found is None:
            raise UmahubError(
                f"node '{node.name}': {node.target} is not supported by TVM's PyTorch frontend; "
                "export the model without it"
            )
        op, _ = found
        args = _args(node, op)
        dtype = _dtype(args["dtype"])
        per_channel = op.endswith("per_channel")
        axis = int(args.get("axis", 0)) if per_channel else 0
        scale = _operand(importer, constants, args["scales" if per_channel else "scale"], "float32")
        zp_arg = args.get("zero_points" if per_channel else "zero_point")
        zp = (
            relax.const(0, dtype)
            if zp_arg is None
            else _operand(importer, constants, zp_arg, dtype)
        )
        x = importer.env[args["input"]]
        if op.startswith("dequantize"):
            out = _dtype(args.get("out_dtype") or "float32")
            return importer.block_builder.emit(
                relax.op.dequantize(x, scale, zp, axis=axis, out_dtype=out)
            )
        q = importer.block_builder.emit(relax.op.quantize(x, scale, zp, axis=axis, out_dtype=dtype))
        qmin, qmax = args.get("quant_min"), args.get("quant_max")
        lo, hi = RANGES.get(dtype, (qmin, qmax))
        if isinstance(qmin, int) and isinstance(qmax, int) and (qmin, qmax) != (lo, hi):
            q = importer.block_builder.emit(relax.op.clip(q, qmin, qmax))
        return q

    return {f"{op}.{overload}": convert for op in OPS for overload in OVERLOADS}


def _operand(importer: Any, constants: _Constants, arg: Any, dtype: str) -> Any:
    """A scale or zero point: a Relax constant of ``dtype`` where the program holds its value."""
    from tvm import relax

    known = constants.get(arg)
    if known is not None:
        value = known[0]
        return relax.const(value.astype(dtype).reshape(-1) if value.ndim else value.astype(dtype))
    expr = importer.env[arg]
    return relax.op.astype(expr, dtype)
