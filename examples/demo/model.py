"""A TVMScript model for `umahub compile examples/demo/model.py`: conv, relu, matmul."""

import tvm
from tvm.script import relax as R


@tvm.script.ir_module
class Module:
    @R.function
    def main(
        x: R.Tensor((1, 8, 8, 8), "float32"),
        w: R.Tensor((8, 8, 3, 3), "float32"),
        fc: R.Tensor((512, 10), "float32"),
    ) -> R.Tensor((1, 10), "float32"):
        with R.dataflow():
            conv = R.nn.conv2d(x, w, padding=1)
            act = R.nn.relu(conv)
            flat = R.reshape(act, (1, 512))
            out = R.matmul(flat, fc)
            R.output(out)
        return out
