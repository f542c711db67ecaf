"""cuDNN 9 enumerations used by the legacy convolution API, with the values of the
headers (``cudnn_graph.h``, ``cudnn_ops.h``).  ``tests/test_cudnn.py`` reads the
headers, where they are installed, and checks every value here.

Each enum's C names are ``PREFIXES[cls] + member name``.
"""

import enum
from typing import Dict, Type


class Status(enum.IntEnum):
    SUCCESS = 0
    NOT_INITIALIZED = 1001
    SUBLIBRARY_VERSION_MISMATCH = 1002
    SUBLIBRARY_LOADING_FAILED = 1008
    BAD_PARAM = 2000
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_SHAPE = 3002
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_LAYOUT = 3004
    NOT_SUPPORTED_ARCH_MISMATCH = 3007
    INTERNAL_ERROR = 4000
    INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003
    INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004
    EXECUTION_FAILED = 5000
    EXECUTION_FAILED_CUDART = 5003


class DataType(enum.IntEnum):
    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    BFLOAT16 = 9


class MathType(enum.IntEnum):
    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1
    TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    FMA_MATH = 3


class TensorFormat(enum.IntEnum):
    NCHW = 0
    NHWC = 1
    NCHW_VECT_C = 2


class ConvolutionMode(enum.IntEnum):
    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class Determinism(enum.IntEnum):
    NON_DETERMINISTIC = 0
    DETERMINISTIC = 1


class FwdAlgo(enum.IntEnum):
    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7
    COUNT = 8


class BwdDataAlgo(enum.IntEnum):
    ALGO_0 = 0
    ALGO_1 = 1
    ALGO_FFT = 2
    ALGO_FFT_TILING = 3
    ALGO_WINOGRAD = 4
    ALGO_WINOGRAD_NONFUSED = 5
    ALGO_COUNT = 6


class BwdFilterAlgo(enum.IntEnum):
    ALGO_0 = 0
    ALGO_1 = 1
    ALGO_FFT = 2
    ALGO_3 = 3
    ALGO_WINOGRAD = 4
    ALGO_WINOGRAD_NONFUSED = 5
    ALGO_FFT_TILING = 6
    ALGO_COUNT = 7


#: The C name of ``member`` is ``PREFIXES[type(member)] + member.name``.
PREFIXES: Dict[Type[enum.IntEnum], str] = {
    Status: "CUDNN_STATUS_",
    DataType: "CUDNN_DATA_",
    MathType: "CUDNN_",
    TensorFormat: "CUDNN_TENSOR_",
    ConvolutionMode: "CUDNN_",
    Determinism: "CUDNN_",
    FwdAlgo: "CUDNN_CONVOLUTION_FWD_ALGO_",
    BwdDataAlgo: "CUDNN_CONVOLUTION_BWD_DATA_",
    BwdFilterAlgo: "CUDNN_CONVOLUTION_BWD_FILTER_",
}


def c_name(member: enum.IntEnum) -> str:
    return PREFIXES[type(member)] + member.name
