// Force-included into every CUDA translation unit that DaCe 1.0.2 generates
// (nvcc -include).  DaCe's runtime headers still use CUB APIs that CUB 3
// (CCCL 3, shipped with CUDA 13) removed.  This header restores the three that
// DaCe needs, in namespace cub, and is a no-op on older CUB versions.
#pragma once
#if defined(__CUDACC__)
#include <cub/version.cuh>
#if CUB_VERSION >= 300000
#include <cstddef>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

namespace cub {

// Block-wide barrier (removed from cub/util_ptx.cuh in CUB 3).
__device__ __forceinline__ void CTA_SYNC() { __syncthreads(); }

// The fancy iterators moved to Thrust; DaCe only constructs and reads them.
template <typename ValueT, typename OffsetT = std::ptrdiff_t>
using CountingInputIterator = thrust::counting_iterator<ValueT>;

template <typename ValueT, typename ConversionOp, typename InputIteratorT,
          typename OffsetT = std::ptrdiff_t>
using TransformInputIterator =
    thrust::transform_iterator<ConversionOp, InputIteratorT, ValueT>;

}  // namespace cub
#endif  // CUB_VERSION >= 300000
#endif  // __CUDACC__
