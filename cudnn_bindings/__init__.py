"""ctypes bindings to cuDNN 9 for 3D convolution: forward, backward data and backward
filter, on torch's CUDA tensors, context and current stream.  No pycuda.

    from cudnn_bindings import conv3d_forward, version
    y = conv3d_forward(x, w, stride=1, padding=1, algo="find", math="ieee")

Importing this package needs neither cuDNN nor a GPU; ``version()`` needs the library
(see :mod:`cudnn_bindings.library` for where it is looked for), and computing needs a
usable CUDA device.  See :mod:`cudnn_bindings.conv` for algorithms and math types.
"""

from .conv import (MATH, PASSES, ConvolutionDescriptor, ConvPlan, FilterDescriptor, Handle,
                   TensorDescriptor, clear_plans, conv3d_backward_data, conv3d_backward_filter,
                   conv3d_forward, handle, live_objects, output_dims, parse_algo, plan)
from .enums import (BwdDataAlgo, BwdFilterAlgo, DataType, FwdAlgo, MathType, Status,
                    TensorFormat)
from .library import CudnnError, CudnnNotFound, candidates, load


def version():
    """cuDNN's version as ``(major, minor, patch)``; raises :class:`CudnnNotFound`."""
    return load().version_tuple


def problem():
    """None if cuDNN can compute here (library found, a handle can be made), else why not."""
    try:
        handle()
    except (CudnnNotFound, CudnnError, OSError) as err:
        return str(err)
    return None


__all__ = [
    "BwdDataAlgo", "BwdFilterAlgo", "ConvPlan", "ConvolutionDescriptor", "CudnnError",
    "CudnnNotFound", "DataType", "FilterDescriptor", "FwdAlgo", "Handle", "MATH", "MathType",
    "PASSES", "Status", "TensorDescriptor", "TensorFormat", "candidates", "clear_plans",
    "conv3d_backward_data", "conv3d_backward_filter", "conv3d_forward", "handle", "load",
    "live_objects", "output_dims", "parse_algo", "plan", "problem", "version",
]
