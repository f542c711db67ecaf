"""The C++ of the Hopper tensor-core main loop, per target: shared-memory matrix descriptors,
``wgmma.mma_async`` and its fence, commit and wait, the async-proxy fence, and on the CPU
their emulation.

**Descriptors** (PTX ISA, "Matrix Descriptor Format" of the asynchronous warpgroup-level
MMA): a 64-bit word with the operand's start address, its leading-dimension byte offset
(LBO) and stride-dimension byte offset (SBO), each in 16-byte units in 14 bits (bits 0-13,
16-29, 32-45), and the swizzle mode in bits 62-63 (0 none, 1 128-byte, 2 64-byte, 3
32-byte).  Both operands here are **K-major with the 128-byte swizzle**: row ``r`` of an
operand (a pixel of A, an output channel of B) holds its 128 bytes of a K tile (64 16-bit
or 32 TF32 values) at ``r * 128``, chunk ``c`` of 16 bytes stored at chunk ``c ^ (r % 8)``
(:func:`convkernels.gpu.mma.layout.swizzle` with 8 chunks a row, which is this pattern
applied to the address: bits 4-6 XOR bits 7-9).  Eight rows make a 1024-byte atom; the SBO
is the distance of two atoms along M or N (1024); the instruction's K (32 bytes) lies
inside one row, so the hardware reads no LBO in this mode (the PTX ISA calls it unused for
swizzled K-major layouts); step ``kk`` of a K tile starts 32 ``kk`` bytes into the rows.

**MN-major operands** (16-bit only: the filter gradient's, whose M and N indices are the
contiguous ones; the instruction's transpose flags set): an atom is 8 reduction rows of
128 bytes of consecutive M or N values (64), row ``k % 8`` at ``128 (k % 8)``; the SBO is
the distance of two 8-row groups along K and the LBO that of two atoms along M or N, so
element (mn, k) lies at ``start + (mn / 64) LBO + (k / 8) SBO + 128 (k % 8) + 2 (mn %
64)``, swizzled on the address as above (the canonical MN-major layouts of CUTLASS's
``make_gmma_desc``; with 64- or 32-byte swizzles, atoms of 32 or 16 values).

**The emulation** decodes a descriptor the way the hardware does: the byte of element
(row, k) of an operand is ``start + (r / 8) SBO + (r % 8) pitch + k bytes`` (pitch 128,
64 or 32 with the swizzle mode), swizzled on the address (bits 4-6, 4-5 or 4 XOR bits 7-9,
7-8 or 7); without a swizzle, core matrices of 8 rows x 16 bytes, LBO apart along K and
SBO apart along M or N.  Addresses are offsets from the operand's array, which the
dynamic shared memory puts at a multiple of 1024 bytes
(:mod:`convkernels.gpu.dynamic_shared`), so the low ten bits, all the swizzle reads, are
the hardware's.  Each thread then sums its own accumulators from PTX's layout of D: the
thread at lane ``l`` of warp ``w`` of the warpgroup holds rows ``16 w + l / 4`` and
``+ 8``, columns ``8 j + 2 (l % 4)`` and ``+ 1``, in registers ``4 j`` to ``4 j + 3``.
"""

from convkernels.gpu.mma.ptx import TF32_CPU

#: The swizzle mode of the descriptors (1: 128 bytes) and the byte offsets they carry.
SWIZZLE_MODE = 1
#: Distance of two 8-row atoms along M or N, in bytes.
SBO_BYTES = 1024
#: Unused by K-major swizzled operands (set as CUTLASS sets it: one 16-byte unit).
LBO_BYTES = 16
#: Bytes of one K-major row of a K tile: the width of the 128-byte swizzle.
ROW_BYTES = 128


def descriptor_code(gpu: bool, mode: int = SWIZZLE_MODE, sbo: int = SBO_BYTES,
                    lbo: int = LBO_BYTES) -> str:
    """C++ ``cb_wgmma_desc(p, base)``: the descriptor of the operand tile at ``p`` (on the
    GPU its shared-memory address; on the CPU its offset from ``base``, the array's
    start)."""
    addr = ("(unsigned)__cvta_generic_to_shared(p)" if gpu
            else "(unsigned)(static_cast<const char*>(p) - static_cast<const char*>(base))")
    qual = "__device__ __forceinline__" if gpu else "static inline"
    return f"""
{qual} uint64_t cb_wgmma_desc(const void* p, const void* base) {{
    (void)base;
    const unsigned a = {addr};
    return (uint64_t)((a & 0x3FFFFu) >> 4) | ((uint64_t)({lbo} >> 4) << 16)
           | ((uint64_t)({sbo} >> 4) << 32) | ((uint64_t){mode} << 62);
}}
"""


def _wgmma_asm(ptx: str, k: int, n: int, mn_major: bool = False) -> str:
    """C++ of ``cb_wgmma_n{n}``: one ``wgmma.mma_async`` m64n{n}k{k} adding A x B to the
    thread's ``n / 2`` float32 sums ``d``, both operands by descriptor (``mn_major``: both
    M- and N-major, the transpose flags set; 16-bit types only)."""
    assert not (mn_major and ptx == "tf32"), "TF32 wgmma takes K-major operands only"
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    trans = "" if ptx == "tf32" else ", 1, 1" if mn_major else ", 0, 0"
    bind = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return f"""
__device__ __forceinline__ void cb_wgmma_n{n}(float* d, uint64_t da, uint64_t db) {{
    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"
                 "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx}.{ptx} "
                 "{{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1{trans};\\n}}\\n"
                 : {bind}
                 : "l"(da), "l"(db));
}}
"""


def fence_operands(count: int, name: str = "acc") -> str:
    """C++ keeping the compiler from moving accesses to the ``count`` sums ``name``
    across an asynchronous MMA's issue or wait (empty on the CPU's side of the macro)."""
    return f"CB_WGMMA_FENCE_OPERANDS({name}, {count});"


_MN_BYTE = r"""
#ifndef CB_WGMMA_BYTE_MN
#define CB_WGMMA_BYTE_MN
// The byte of element (byte mb along M or N, reduction row k) of an MN-major operand.
static inline unsigned cb_wgmma_byte_mn(uint64_t d, int mb, int k) {
    const unsigned start = (unsigned)(d & 0x3FFFu) << 4;
    const unsigned lbo = (unsigned)((d >> 16) & 0x3FFFu) << 4;
    const unsigned sbo = (unsigned)((d >> 32) & 0x3FFFu) << 4;
    const int mode = (int)(d >> 62);
    if (mode == 0)  // core matrices of 16 bytes x 8 rows: SBO along M/N, LBO along K
        return start + (mb / 16) * sbo + (k / 8) * lbo + (k % 8) * 16 + mb % 16;
    const unsigned pitch = mode == 1 ? 128u : mode == 2 ? 64u : 32u;
    const unsigned bits = mode == 1 ? 7u : mode == 2 ? 3u : 1u;
    const unsigned a = start + (mb / pitch) * lbo + (k / 8) * sbo + (k % 8) * pitch + mb % pitch;
    return a ^ (((a >> 7) & bits) << 4);
}
#endif
"""


def helpers(ptx: str, k: int, n: int, gpu: bool, mode: int = SWIZZLE_MODE,
            sbo: int = SBO_BYTES, lbo: int = LBO_BYTES, mn_major: bool = False) -> str:
    """The C++ the main loop calls for operands of PTX type ``ptx``, wgmma reduction ``k``
    and ``n`` columns: ``cb_wgmma_desc``, ``cb_wgmma_n{n}`` (CPU: the emulation, with the
    thread's index in its warpgroup and the operands' arrays), ``cb_wgmma_fence``,
    ``cb_wgmma_commit``, ``cb_wgmma_wait<N>``, ``cb_fence_proxy_async`` and
    ``CB_WGMMA_FENCE_OPERANDS``.  ``mode``, ``sbo``, ``lbo``: the descriptors' fields
    (other values are the plants of the tests); ``mn_major``: both operands M- or N-major
    (the module docstring)."""
    desc = descriptor_code(gpu, mode, sbo, lbo)
    if gpu:
        return r"""
#ifndef CB_WGMMA_HELPERS_GPU
#define CB_WGMMA_HELPERS_GPU
__device__ __forceinline__ void cb_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cb_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cb_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Generic-proxy writes (cp.async) made visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void cb_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void cb_fence_operand(float& r) {
    asm volatile("" : "+f"(r) :: "memory");
}
#define CB_WGMMA_FENCE_OPERANDS(a, n) \
    _Pragma("unroll") for (int i_ = 0; i_ < (n); ++i_) cb_fence_operand((a)[i_]);
#endif
""" + desc + _wgmma_asm(ptx, k, n, mn_major)
    value = {"f16": "cb_half_to_float(bits)", "bf16": "cb_bf16_to_float(bits)",
             "tf32": "cb_tf32_value(bits)"}[ptx]
    eb = 4 if ptx == "tf32" else 2
    major = "M- and N-major" if mn_major else "K-major"

    def at(d, row):  # the byte of element (row, kk) of the operand that descriptor d names
        return (f"cb_wgmma_byte_mn({d}, ({row}) * {eb}, kk)" if mn_major
                else f"cb_wgmma_byte({d}, {row}, kk * {eb})")
    load = ("unsigned bits; std::memcpy(&bits, p, 4);" if eb == 4
            else "uint16_t bits; std::memcpy(&bits, p, 2);")
    return TF32_CPU + r"""
#ifndef CB_WGMMA_HELPERS_CPU
#define CB_WGMMA_HELPERS_CPU
#include <cstring>
static inline void cb_wgmma_fence() {}
static inline void cb_wgmma_commit() {}
template <int N> static inline void cb_wgmma_wait() {}
static inline void cb_fence_proxy_async() {}
#define CB_WGMMA_FENCE_OPERANDS(a, n) (void)(a);
// The byte of element (row r, byte kb along K) of a K-major operand that descriptor d
// names: see convkernels.gpu.wgmma.ptx.
static inline unsigned cb_wgmma_byte(uint64_t d, int r, int kb) {
    const unsigned start = (unsigned)(d & 0x3FFFu) << 4;
    const unsigned lbo = (unsigned)((d >> 16) & 0x3FFFu) << 4;
    const unsigned sbo = (unsigned)((d >> 32) & 0x3FFFu) << 4;
    const int mode = (int)(d >> 62);
    if (mode == 0)  // core matrices of 8 rows x 16 bytes: LBO along K, SBO along M/N
        return start + (r / 8) * sbo + (kb / 16) * lbo + (r % 8) * 16 + kb % 16;
    const unsigned pitch = mode == 1 ? 128u : mode == 2 ? 64u : 32u;
    const unsigned bits = mode == 1 ? 7u : mode == 2 ? 3u : 1u;
    const unsigned a = start + (r / 8) * sbo + (r % 8) * pitch + kb;
    return a ^ (((a >> 7) & bits) << 4);
}
#endif
""" + (_MN_BYTE if mn_major else "") + desc + f"""
// wgmma.mma_async m64n{n}k{k} as the thread at `lane` (0-127) of its warpgroup sees it: its
// sums D[16 w + l / 4 + 8 (i / 2)][8 j + 2 (l % 4) + i % 2] in d[4 j + i], each operand
// element read where its descriptor puts it (A: 64 x {k}, B: {n} x {k}, both {major}).
static inline void cb_wgmma_n{n}(float* d, int lane, const char* abase, uint64_t da,
                                 const char* bbase, uint64_t db) {{
    const int w = lane / 32, g = (lane % 32) / 4, t = lane % 4;
    float a[2][{k}];
    for (int h = 0; h < 2; ++h)
        for (int kk = 0; kk < {k}; ++kk) {{
            const char* p = abase + {at("da", "16 * w + g + 8 * h")};
            {load}
            a[h][kk] = {value};
        }}
    for (int j = 0; j < {n // 8}; ++j)
        for (int c = 0; c < 2; ++c) {{
            float b[{k}];
            for (int kk = 0; kk < {k}; ++kk) {{
                const char* p = bbase + {at("db", "8 * j + 2 * t + c")};
                {load}
                b[kk] = {value};
            }}
            for (int h = 0; h < 2; ++h) {{
                float sum = d[4 * j + 2 * h + c];
                for (int kk = 0; kk < {k}; ++kk) sum += a[h][kk] * b[kk];
                d[4 * j + 2 * h + c] = sum;
            }}
        }}
}}
"""
