"""The kernel library of umahub-vanilla: where it is and how generated C uses it.

No TVM import here, so that loading the plugin stays cheap.
"""

from __future__ import annotations

from pathlib import Path

#: Name of the C function the pass calls (declared in kernels/vanilla_conv2d.h).
EXTERN_NAME = "vanilla_conv2d_nchw"
#: The same with a bias per output channel, for a convolution and its bias add.
EXTERN_BIAS_NAME = "vanilla_conv2d_nchw_bias"
#: The same, then bounded by an activation (a ReLU, a ReLU6, a clip).
EXTERN_CLAMP_NAME = "vanilla_conv2d_nchw_bias_clamp"
#: Directory of the kernel library shipped with the package.
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
#: C sources to compile and link into the exported library.
C_SOURCES = [str(KERNEL_DIR / "vanilla_conv2d.c")]
#: Include directories (``-I``) for the generated C and the kernel sources.
INCLUDE_DIRS = [str(KERNEL_DIR)]
#: Text to put at the top of the generated C source.
C_INCLUDES = '#include "vanilla_conv2d.h"\n'
