"""``cp.async`` for the tasklets of the pipelined kernels, per target: the asynchronous
copy of 4, 8 or 16 bytes (of any element type) from global to shared memory with its zero-fill
(2 bytes, one 16-bit value, are an ordinary copy: ``cp.async`` moves 4 at least) (a source size
of 0 reads nothing and writes zeros), its commit and wait, and a 4-float load
(``cb_ld4``, one ``LDS.128`` from 16-byte aligned shared memory).  On the CPU the copy is
a ``memcpy`` (or a zero fill) and the commit and wait do nothing: the CPU schedule runs
the threads of a block one after another, so every copy is complete when it is read.
"""

#: Helpers the tasklets call, per target: the asynchronous copy with zero-fill, its
#: commit and wait, and a 4-float load (``cb_f4``).
GPU_HELPERS = r"""
#ifndef CB_PIPELINED_HELPERS
#define CB_PIPELINED_HELPERS
struct cb_f4 { float x, y, z, w; };
__device__ __forceinline__ cb_f4 cb_ld4(const float* p) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    return {v.x, v.y, v.z, v.w};
}
template <int BYTES>
__device__ __forceinline__ void cb_cp_async(void* dst, const void* src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const size_t g = __cvta_generic_to_global(src);
    const int n = valid ? BYTES : 0;  // 0: nothing is read, the destination is zero-filled
    if constexpr (BYTES == 2) {  // below cp.async's 4 bytes: an ordinary copy (one 16-bit value)
        *static_cast<unsigned short*>(dst) = valid ? *static_cast<const unsigned short*>(src) : 0;
    } else if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(s), "l"(g), "r"(n) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                     :: "r"(s), "l"(g), "n"(BYTES), "r"(n) : "memory");
}
__device__ __forceinline__ void cb_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cb_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
#endif
"""

CPU_HELPERS = r"""
#ifndef CB_PIPELINED_HELPERS
#define CB_PIPELINED_HELPERS
#include <cstring>
struct cb_f4 { float x, y, z, w; };
static inline cb_f4 cb_ld4(const float* p) { return {p[0], p[1], p[2], p[3]}; }
template <int BYTES>
static inline void cb_cp_async(void* dst, const void* src, bool valid) {
    if (valid) std::memcpy(dst, src, BYTES); else std::memset(dst, 0, BYTES);
}
static inline void cb_cp_commit() {}
template <int N> static inline void cb_cp_wait() {}
#endif
"""
