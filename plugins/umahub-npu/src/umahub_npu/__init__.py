"""umahub-npu: a matrix engine with a 256 KiB scratchpad, emulated on the CPU.

Accelerator ``npu``: one instance, LLVM codegen for this host's CPU, two pools:
``npu.dram`` where its partitions' tensors live, and ``npu.sram``, the
scratchpad that tiles are brought into by DMA (asynchronous copies).

* patterns: quantized convolutions and matmuls (``dequantize -> op (+ bias)
  (+ ReLU/clip) -> quantize``, 8-bit, symmetric weights), computed in integers
  as umahub defines them (:mod:`umahub.plugin.quantization`), bit for bit the
  host's, with the table that umahub made of the activation after them (a
  SiLU, a sigmoid: ``take(table, y)``) read in their epilogue, so that the
  output does not go to the host for its lookup and back; float32 matmul /
  dense and conv2d (depthwise included) with an optional epilogue: a bias
  add (or, for conv2d, an inference batch norm), a residual add (a tensor
  computed at run time: a residual block's input), and an activation (relu,
  gelu, clip, SiLU, hardswish, hardsigmoid); batched matmul (attention).
  umahub folds a batch norm that follows a convolution into its weight and a
  bias before partitioning, so the batch norm patterns are for the rest. A
  convolution whose input is gated per channel (a squeeze-and-excitation
  block's ``x * gate``, the gate (N, C, 1, 1)) takes the product with it, so
  that x does not go to the host and back for it. The conv2d check needs the
  input channels to fill the engine's 8-wide array (a multiple of 8), or a
  depthwise convolution; a convolution on 3 RGB channels is left to others.
  In QDQ form, a squeeze-and-excitation block's gate (``quantize(x *
  dequantize(gate))``, one 8-bit value per channel), with ``x``'s dequantize
  where ``x`` is 8-bit (umahub gives each its own), is elementwise after the
  float values the host computes too, so it stays on the npu, bit for bit the
  host's; so does a residual block's add (``quantize(dequantize(a) +
  dequantize(b))``, with its ReLU). Its pooling quantized
  (``quantize(mean(dequantize(x)))``) is a sum, which umahub computes in
  integers (:mod:`umahub.plugin.integer_mean`): the npu's, added in vector
  lanes, gives the host's integers too. (A quantized mean of a float tensor,
  ``quantize(mean(x))``, is a float sum: its last bit is the npu's order's.)
  And a mean over a tensor's last axes (a global average pooling), a max
  pooling (with the ReLU before it), and a concatenation (its DMA gathers the
  pieces): SqueezeNet's and Inception's branches meet and are pooled on the
  npu, instead of going to the host and back.
* schedule: :func:`umahub_npu.schedules.schedule` tiles the computation so a
  tile's working set fits ``npu.sram``, keeps the accumulator local, computes
  the epilogue per tile, vectorizes and parallelizes: this plugin is what a
  schedule hook is for.
* relax_to_tir: the default lowering, except that GELU's erf and sigmoid's
  exp become polynomials the vector units evaluate (TVM's legalization calls
  the scalar C ``erff``/``expf`` per element), a batch norm is a
  per-channel scale and shift computed once, before the convolution, and a
  convolution with a constant filter computes its output channels padded to
  whole vectors (:mod:`umahub_npu.lowering`).
* tuning_space: for ``umahub tune``, its float32 matmul, conv2d and pointwise
  schedules with their tile sizes drawn (:func:`umahub_npu.schedules.drawing_tiles`).
* codegen: LLVM for this host's CPU (``-mcpu`` of the host), so the vector
  units (AVX2/FMA) the schedule counts on are used; in a cross build, for the
  compile's target (``context.target``), whose vector width the schedule takes.
"""

from __future__ import annotations

from umahub.plugin import Accelerator, MemoryPool, Refusal, hookimpl, human_size

UMAHUB_API = 1

NAME = "npu"
SRAM_BYTES = 256 * 1024
DRAM_BYTES = 1024 * 1024 * 1024
ARRAY_WIDTH = 8


#: The Relax operators its patterns take (alone or fused), shown by ``umahub plugins``.
OPERATORS = (
    "relax.matmul",
    "relax.nn.conv2d",
    "relax.nn.batch_norm",
    "relax.add",
    "relax.multiply",
    "relax.divide",
    "relax.nn.relu",
    "relax.clip",
    "relax.sigmoid",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.mean",
    "relax.concat",
    "relax.nn.max_pool2d",
    "relax.quantize",
    "relax.dequantize",
    "relax.take",
    "relax.astype",
)


@hookimpl
def umahub_accelerators():
    """The npu: DRAM for tensors, a 256 KiB scratchpad for tiles, DMA copies."""
    return [
        Accelerator(
            NAME,
            codegen="llvm",
            memory=[
                MemoryPool("npu.dram", DRAM_BYTES, copy="async"),
                MemoryPool("npu.sram", SRAM_BYTES, copy="async"),
            ],
            description="matrix engine with a 256 KiB scratchpad: matmul and conv2d",
            merge=False,  # its schedules take one matmul or conv2d (with epilogue) at a time
            operators=OPERATORS,
        )
    ]


def _float32_static(ctx, bounded: bool = False) -> Refusal | None:
    """None when every tensor of the match is float32 of static shape, else why not.

    ``bounded``: a size known only at run time is taken too when it has an upper
    bound (a prompt's length, bounded by the model's context: ``tir_var_upper_bound``).
    """
    from umahub.plugin import TensorType, bounded_shape_of, dtype_of, shape_of, type_of

    for value in ctx.matched_bindings.values():
        if not isinstance(type_of(value), TensorType):
            continue  # batch norm's tuple: its fields are the tensors of other bindings
        if dtype_of(value) != "float32":
            return Refusal(f"a {dtype_of(value)} tensor; the npu computes float32 only")
        if shape_of(value) is not None:
            continue
        if not bounded:
            return Refusal("a tensor whose shape is known only at run time")
        if bounded_shape_of(value) is None:
            return Refusal(
                "a tensor whose size is known only at run time, with no upper bound "
                "(main's tir_var_upper_bound attribute bounds it)"
            )
    return None


def matmul_ok(ctx) -> bool | Refusal:
    """float32, 2-D to 4-D operands, static shapes or a bounded symbolic number of rows
    (a prompt's tokens): the schedule tiles the static columns and reduction and loops
    over the rows."""
    from umahub.plugin import bounded_shape_of, calls, shape_of

    refused = _float32_static(ctx, bounded=True)
    if refused is not None:
        return refused
    for mm in calls(ctx, "relax.matmul"):
        for shape in (bounded_shape_of(a) for a in mm.args):
            if shape is None:
                return Refusal("a matmul operand whose shape is known only at run time")
            if not 2 <= len(shape) <= 4:
                return Refusal(
                    f"a {len(shape)}-D matmul operand; the npu takes 2-D to 4-D operands"
                )
        if shape_of(mm.args[1]) is None or not _static_reduction(mm.args[0]):
            return Refusal(
                "a matmul whose columns or reduction have a size known only at run time; "
                "the npu tiles those statically (only the rows may vary)"
            )
    return True


def _static_reduction(operand) -> bool:
    """Whether the last axis of a matmul's first operand (its reduction) is static."""
    from umahub.plugin import type_of

    return hasattr(type_of(operand).shape.values[-1], "value")


def conv2d_ok(ctx) -> bool | Refusal:
    """NCHW/OIHW, dilation 1, and input channels a multiple of 8 or depthwise."""
    from umahub.plugin import calls, shape_of

    refused = _float32_static(ctx)
    if refused is not None:
        return refused
    for conv in calls(ctx, "relax.nn.conv2d"):
        attrs = conv.attrs
        layout = (str(attrs.data_layout), str(attrs.kernel_layout))
        if layout != ("NCHW", "OIHW"):
            return Refusal(f"layout {'/'.join(layout)}; the npu takes NCHW/OIHW")
        dilation = tuple(int(d) for d in attrs.dilation)
        if any(d != 1 for d in dilation):
            return Refusal(f"dilation {dilation}; the npu takes dilation 1 only")
        channels = shape_of(conv.args[0])[1]
        groups = int(attrs.groups)
        depthwise = groups == channels and shape_of(conv.args[1])[0] == channels
        if depthwise:
            continue
        if groups != 1:
            return Refusal(f"a grouped convolution ({groups} groups) that is not depthwise")
        if channels % ARRAY_WIDTH:
            return Refusal(
                f"{channels} input channels, not a multiple of the npu's {ARRAY_WIDTH}-wide array"
            )
    for norm in calls(ctx, "relax.nn.batch_norm"):
        if bool(norm.attrs.training) or int(norm.attrs.axis) != 1:
            return Refusal("a batch norm in training mode or not over channels (axis 1)")
        if any(shape_of(a) is None or len(shape_of(a)) != 1 for a in norm.args[1:]):
            return Refusal("batch norm statistics that are not one value per channel")
    return True


def scaled_conv2d_ok(ctx) -> bool | Refusal:
    """:func:`conv2d_ok`, and the convolution's input is scaled per channel: an
    (N, C, H, W) tensor times an (N, C, 1, 1) one (a squeeze-and-excitation
    block's gate), not SiLU's ``x * sigmoid(x)``."""
    from umahub.plugin import calls, shape_of

    checked = conv2d_ok(ctx)
    if checked is not True:
        return checked
    for conv in calls(ctx, "relax.nn.conv2d"):
        scale = ctx.matched_bindings.get(conv.args[0])
        if scale is None:
            continue
        operands = [shape_of(a) or () for a in scale.args]
        data = shape_of(conv.args[0])
        if not (
            data is not None
            and len(operands) == 2
            and data in operands
            and any(len(g) == 4 and g[:2] == data[:2] and g[2:] == (1, 1) for g in operands)
            and data[2:] != (1, 1)
        ):
            return Refusal("the convolution's input is not scaled per channel")
    return True


def mean_ok(ctx) -> bool | Refusal:
    """float32, static shapes, the mean over the tensor's last axes (a global
    average pooling's spatial axes)."""
    from umahub.plugin import calls

    refused = _float32_static(ctx)
    if refused is not None:
        return refused
    for mean in calls(ctx, "relax.mean"):
        checked = _mean_axes(mean)
        if checked is not True:
            return checked
    return True


def max_pool_ok(ctx) -> bool | Refusal:
    """float32, static shapes, NCHW, dilation 1, a window of at most 64 elements."""
    from umahub.plugin import WINDOW_MAX, calls

    refused = _float32_static(ctx)
    if refused is not None:
        return refused
    for pool in calls(ctx, "relax.nn.max_pool2d"):
        attrs = pool.attrs
        if str(attrs.layout) != "NCHW" or str(attrs.out_layout) not in ("NCHW", ""):
            return Refusal(f"layout {attrs.layout}; the npu pools NCHW only")
        if any(int(d) != 1 for d in attrs.dilation):
            return Refusal("a dilated max pooling; the npu takes dilation 1 only")
        window = [int(k) for k in attrs.pool_size]
        if window[0] * window[1] > WINDOW_MAX:
            return Refusal(
                f"a {window[0]}x{window[1]} window; the npu pools {WINDOW_MAX} elements at most"
            )
    return True


def quantized_ok(ctx) -> bool | Refusal:
    """8-bit operands, symmetric weights (zero point 0), dilation 1, a convolution
    dense or depthwise: its integer datapath (umahub computes the arithmetic)."""
    from umahub.plugin import quantized_operator, shape_of

    op = quantized_operator(ctx)
    roles = [("input", op.data), ("weight", op.weight), ("output", op.output)]
    if op.residual is not None:
        roles.append(("residual", op.residual))
    for role, params in roles:
        if params.dtype not in ("int8", "uint8"):
            return Refusal(f"a {params.dtype} {role}; the npu's integer datapath is 8-bit")
    if not op.weight.symmetric:
        return Refusal("weights with a nonzero zero point; the npu takes symmetric weights")
    if op.kind == "conv2d":
        attrs = op.call.attrs
        if any(int(d) != 1 for d in attrs.dilation):
            return Refusal("a dilated convolution; the npu takes dilation 1 only")
        groups = int(attrs.groups)
        if groups != 1 and groups != (shape_of(op.call.args[0]) or (0, 0))[1]:
            return Refusal(f"a grouped convolution ({groups} groups) that is not depthwise")
    return True


def _one_scale(call) -> bool:
    """Whether a quantize's or dequantize's scale and zero point are one value each."""
    from umahub.plugin import shape_of

    return all(shape_of(a) in ((), (1,)) for a in call.args[1:])


def quantized_mean_ok(ctx) -> bool | Refusal:
    """A float32 mean of static shape over the tensor's last axes (:func:`mean_ok`'s),
    its result quantized with one scale (a squeeze-and-excitation block's pooling,
    quantized for the convolution after it)."""
    from umahub.plugin import calls, dtype_of, shape_of

    if not all(_one_scale(q) for q in calls(ctx, "relax.quantize")):
        return Refusal("a quantize with a scale per channel")
    for mean in calls(ctx, "relax.mean"):
        if dtype_of(mean) != "float32" or shape_of(mean.args[0]) is None:
            return Refusal("a mean that is not of a float32 tensor of static shape")
        checked = _mean_axes(mean)
        if checked is not True:
            return checked
    return True


def integer_mean_ok(ctx) -> bool | Refusal:
    """A mean of a dequantized 8-bit tensor over its last axes, quantized, that umahub
    computes in integers (:func:`umahub.plugin.integer_mean`): the host's integers,
    whatever order the npu's sum adds in."""
    from umahub.plugin import quantized_mean

    try:
        quantized_mean(ctx)
    except ValueError as err:
        return Refusal(f"umahub cannot compute it in integers: {err}")
    return quantized_mean_ok(ctx)


def quantized_gate_ok(ctx) -> bool | Refusal:
    """A float32 (N, C, H, W) tensor times a dequantized 8-bit (N, C, 1, 1) gate,
    quantized with one scale: a squeeze-and-excitation block's gate in QDQ form,
    elementwise in the host's arithmetic (no sum: every device rounds it alike)."""
    from umahub.plugin import calls, dtype_of, shape_of

    (product,) = calls(ctx, "relax.multiply")
    (out,) = calls(ctx, "relax.quantize")
    operands = [ctx.matched_bindings.get(a, a) for a in product.args]
    gate = operands[1] if shape_of(operands[1]) != shape_of(product) else operands[0]
    data = operands[0] if gate is operands[1] else operands[1]
    dequantizes = calls(ctx, "relax.dequantize")
    if not any(gate.same_as(d) for d in dequantizes):
        return Refusal("a gate that is not a dequantized tensor")
    if dtype_of(gate.args[0]) not in ("int8", "uint8"):
        return Refusal(f"a {dtype_of(gate.args[0])} gate; the npu's gates are 8-bit")
    if not all(_one_scale(c) for c in (*dequantizes, out)):
        return Refusal("a quantize or dequantize with a scale per channel")
    shape, gate_shape = shape_of(data), shape_of(gate)
    if shape is None or gate_shape is None or dtype_of(data) != "float32":
        return Refusal("a product that is not of a float32 tensor of static shape")
    if not (len(shape) == 4 and gate_shape == (*shape[:2], 1, 1)):
        return Refusal(f"a gate of shape {gate_shape} for a tensor of {shape}, not one per channel")
    return True


def quantized_add_ok(ctx) -> bool | Refusal:
    """The sum of two dequantized 8-bit tensors of one static shape, quantized (with a
    ReLU, where there is one), each with one scale: a residual block's add in QDQ
    form (MobileNetV2's, ResNet's), elementwise in the host's arithmetic."""
    from umahub.plugin import calls, dtype_of, shape_of

    (total,) = calls(ctx, "relax.add")
    terms = calls(ctx, "relax.dequantize")
    if any(dtype_of(t.args[0]) not in ("int8", "uint8") for t in terms):
        return Refusal("a dequantize of another type than 8 bits")
    if not all(_one_scale(c) for c in (*terms, *calls(ctx, "relax.quantize"))):
        return Refusal("a quantize or dequantize with a scale per channel")
    shapes = {shape_of(a) for a in total.args}
    if len(shapes) != 1 or None in shapes:
        return Refusal("a sum of tensors of different or unknown shapes")
    return True


def _mean_axes(mean) -> bool | Refusal:
    from umahub.plugin import shape_of

    ndim = len(shape_of(mean.args[0]) or ())
    axes = mean.attrs.axis
    axes = sorted(int(a) % ndim for a in axes) if axes is not None else list(range(ndim))
    if axes != list(range(ndim - len(axes), ndim)):
        return Refusal(f"a mean over axes {axes}; the npu takes the last axes only")
    return True


#: The most tensors a concatenation on the npu joins (DenseNet's have more).
CONCAT_MAX = 8


def concat_ok(ctx) -> bool | Refusal:
    """float32, static shapes."""
    refused = _float32_static(ctx)
    return True if refused is None else refused


@hookimpl(accelerator=NAME)
def umahub_patterns():
    """Largest matches first: op + bias + activation, op + bias, op + activation, op."""
    from tvm.relax.dpl import is_const, is_op, is_tuple, is_tuple_get_item, wildcard

    from umahub.plugin import conv2d, dequantized, epilogues, matmul, quantized

    conv = conv2d()
    # an inference batch norm after the convolution is part of its epilogue
    norm = is_tuple_get_item(is_op("relax.nn.batch_norm")(conv, *[wildcard() for _ in range(4)]), 0)
    # Not the norm alone: a match cannot end at a tuple's item (the batch norm
    # of a branch whose sum another partition computes stays on the host). Nor
    # norm + add without an activation: TVM 0.27's FuseOpsByPattern then loses
    # a variable that another match reads (mobilenet_v2's residual adds).
    normalised = [
        p
        for p in epilogues(NAME, "conv2d_bn", norm, conv2d_ok)
        if p[0].endswith(("act", "hswish", "hsigmoid"))
    ]
    # a squeeze-and-excitation block's gate applied to the convolution's input:
    # the product stays on the npu, instead of going to the host and back
    scaled = conv2d(is_op("relax.multiply")(wildcard(), wildcard()))
    # a global average pooling: the tensor it reads need not go to the host for it;
    # quantized (a squeeze-and-excitation block's in QDQ form), its result need not either
    out = is_op("relax.quantize")
    mean = [
        (
            f"{NAME}.qmean",
            out(is_op("relax.mean")(dequantized()), is_const(), is_const()),
            {},
            integer_mean_ok,
        ),
        (
            f"{NAME}.mean_quantize",
            out(is_op("relax.mean")(wildcard()), is_const(), is_const()),
            {},
            quantized_mean_ok,
        ),
        (f"{NAME}.mean", is_op("relax.mean")(wildcard()), {}, mean_ok),
    ]
    # a squeeze-and-excitation block's gate in QDQ form: quantize(x * dequantize(gate))
    # (both operands may be dequantized: one pattern per order, each checked on its own)
    multiply = is_op("relax.multiply")
    gated = [
        (f"{NAME}.qgate{side}", out(product, is_const(), is_const()), {}, quantized_gate_ok)
        for side, product in (
            ("_both", multiply(dequantized(), dequantized())),
            ("", multiply(dequantized(), wildcard())),
            ("_right", multiply(wildcard(), dequantized())),
        )
    ]
    # a residual block's add in QDQ form: quantize(dequantize(a) + dequantize(b)), with
    # the ReLU after it where there is one: the tensors need not go to the host and back
    total = is_op("relax.add")(dequantized(), dequantized())
    added = [
        (
            f"{NAME}.qadd_relu",
            out(is_op("relax.nn.relu")(total), is_const(), is_const()),
            {},
            quantized_add_ok,
        ),
        (f"{NAME}.qadd", out(total, is_const(), is_const()), {}, quantized_add_ok),
    ]
    # a max pooling, with the ReLU before it (SqueezeNet's stem, ResNet's)
    pool = is_op("relax.nn.max_pool2d")
    pools = [
        (f"{NAME}.relu_max_pool2d", pool(is_op("relax.nn.relu")(wildcard())), {}, max_pool_ok),
        (f"{NAME}.max_pool2d", pool(wildcard()), {}, max_pool_ok),
    ]
    # the tensors of a concatenation, one pattern per count (a wildcard for the
    # tuple would make the tuple the partition's parameter)
    concat = [
        (
            f"{NAME}.concatenate",
            is_op("relax.concat")(is_tuple([wildcard() for _ in range(n)])),
            {},
            concat_ok,
        )
        for n in range(CONCAT_MAX, 1, -1)
    ]
    # quantized operators first: claimed whole, in integers (umahub.plugin.quantization)
    return (
        quantized(NAME, "conv2d", quantized_ok, tables=True)
        + quantized(NAME, "matmul", quantized_ok, tables=True)
        + epilogues(NAME, "matmul", matmul(), matmul_ok)
        + normalised
        + epilogues(NAME, "conv2d_scaled", scaled, scaled_conv2d_ok)
        + epilogues(NAME, "conv2d", conv, conv2d_ok)
        + mean
        + gated
        + added
        + pools
        + concat
    )


@hookimpl(accelerator=NAME)
def umahub_relax_to_tir(function, context):
    """The default lowering, except for GELU, sigmoid, batch norm and convolutions'
    output channels (see umahub_npu.lowering)."""
    from umahub_npu.lowering import LEGALIZE, lower

    ops = {o.op for o in context.operators}
    if not (set(LEGALIZE) & ops or ("relax.nn.conv2d" in ops and context.weights)):
        return None
    return lower(function, context.symbol, NAME, context.weights)


@hookimpl(accelerator=NAME)
def umahub_schedule(accelerator, schedule, context):
    """Tile to the scratchpad, vectorize, parallelize (see umahub_npu.schedules)."""
    from umahub.plugin import schedule_int8
    from umahub_npu.schedules import schedule as npu_schedule

    # a quantized operator: umahub's int8 schedule (vpdpbusd where the target has VNNI)
    said = schedule_int8(schedule, target=context.target, weights=context.weights)
    if said is not None:
        return said
    sram = next(p.size_bytes for p in accelerator.memory if p.scope == "npu.sram")
    lanes = None
    if context.target is not None:  # a cross build: the vector width of the target's CPU
        from umahub.plugin import vector_lanes

        lanes = vector_lanes(context.target)
    strategy = npu_schedule(schedule, sram_bytes=sram, lanes=lanes, weights=context.weights)
    if strategy == "none":
        return "not recognised: left unscheduled"
    if strategy == "elementwise":
        return "elementwise: outer loops in parallel"
    if strategy == "pooling":
        return "pooling: output rows in parallel, a row of column maxima each"
    if strategy == "gemv":
        return "gemv: column panels in parallel, each over the whole reduction in registers"
    return f"{strategy}: tiles fit npu.sram ({human_size(sram)})"


@hookimpl(accelerator=NAME)
def umahub_tuning_space(accelerator, function, context):
    """Its matmul and conv2d schedules with their tile sizes drawn, for float32 kernels."""
    import tvm
    from tvm import s_tir

    from umahub.plugin import TuningSpace, param_buffers
    from umahub_npu.schedules import TUNED_KINDS, drawing_tiles, plan
    from umahub_npu.schedules import schedule as npu_schedule

    if any(b is None or str(b.dtype) != "float32" for b in param_buffers(function)):
        return None  # the quantized kernels are umahub's (schedule_int8)
    found = plan(s_tir.Schedule(tvm.IRModule({"main": function})))
    if found is None or found.kind not in TUNED_KINDS:
        return None
    sram = next(p.size_bytes for p in accelerator.memory if p.scope == "npu.sram")
    lanes = None
    if context.target is not None:
        from umahub.plugin import vector_lanes

        lanes = vector_lanes(context.target)

    def space(schedule):
        with drawing_tiles(schedule):
            strategy = npu_schedule(schedule, sram_bytes=sram, lanes=lanes, weights=context.weights)
        if strategy == "none":
            raise ValueError("the npu's schedule refused these tile sizes")

    return TuningSpace(
        schedule=space, description=f"npu {found.kind}: tile sizes drawn within npu.sram"
    )


@hookimpl(accelerator=NAME)
def umahub_codegen(module, context):
    """LLVM for the compile's target (``context.target``, a cross build), else for this
    host's CPU, so that the AVX2/FMA the schedule counts on are there."""
    import tvm

    from umahub.plugin import host_target

    target = context.target
    if target is None:
        target = tvm.target.Target(host_target())
    return tvm.tirx.build(module, target=target, pipeline=context.tir_pipeline)
