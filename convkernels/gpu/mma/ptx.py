"""The C++ helpers of the tensor-core kernels (:mod:`convkernels.gpu.mma`: the forward, the
data gradient and the filter gradient),
per target: ``cb_ldsm_x4`` (``ldmatrix.x4``, ``.trans`` too), ``cb_lds_x4`` (four 32-bit
shared loads, TF32's N-major operands), ``cb_lds_lane`` and ``cb_mma`` on the GPU; on the
CPU the same calls building every lane's registers as the hardware distributes them, and
``cb_mma_emulated``, one lane's share of an ``mma.sync`` from PTX's fragment layout."""


#: The CPU's TF32 operand (both tensor-core main loops' emulations): a float32 register as
#: the tensor cores read it, its low 13 bits ignored.
TF32_CPU = r"""
#ifndef CB_TF32_CPU
#define CB_TF32_CPU
#include <cstring>
static inline float cb_tf32_value(unsigned u) {
    u &= 0xffffe000u;
    float f; std::memcpy(&f, &u, 4); return f;
}
#endif
"""


#: The int8 MMA on the GPU: m16n8k32, int8 operands (four per register), int32 sums.
_S8_MMA = r"""
__device__ __forceinline__ void cb_mma(int* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""


def helpers(s, gpu: bool) -> str:
    """C++ the tasklets call, for the constants ``s`` of a tensor-core build (its ``ptx``
    type and MMA reduction ``KM``): ``cb_ldsm_x4<trans>`` (registers of lane ``lane``
    from the rows that ``addr(ln)`` names for each lane ``ln``), ``cb_lds_x4`` (register
    ``j`` from ``addr(lane, j)``), ``cb_mma`` (GPU) or ``cb_mma_emulated`` (CPU)."""
    ptx, k = s.ptx, s.KM
    if gpu:
        return r"""
#ifndef CB_MMA_HELPERS_GPU
#define CB_MMA_HELPERS_GPU
template <bool TRANS, class F>
__device__ __forceinline__ void cb_ldsm_x4(unsigned (&r)[4], const char* base, F addr, int lane) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(base + addr(lane)));
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
// The byte of lane ln's value in a 128-byte block of a blocked tile: value
// ln / 4 of row ln % 4.  Opaque to the compiler, so that each load's address stays this
// plus a constant (an immediate offset) rather than being folded into one mask per load.
__device__ __forceinline__ int cb_lds_lane(int ln) {
    int b = ((ln & 3) * 8 + (ln >> 2)) * 4;
    asm("mov.b32 %0, %0;\n" : "+r"(b));
    return b;
}
template <class F>
__device__ __forceinline__ void cb_lds_x4(unsigned (&r)[4], const char* base, F addr, int lane) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(base));
    #pragma unroll
    for (int j = 0; j < 4; ++j)
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(r[j]) : "r"(s + (unsigned)addr(lane, j)));
}
#endif
""" + (_S8_MMA if ptx == "s8" else f"""
__device__ __forceinline__ void cb_mma(float* d, const unsigned* a, const unsigned* b) {{
    asm volatile("mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx}.{ptx}.f32 "
                 "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
""")
    value = {"f16": "cb_half_to_float((uint16_t)h)", "bf16": "cb_bf16_to_float((uint16_t)h)",
             "tf32": "cb_tf32_value(w)", "s8": ""}[ptx]
    if ptx == "s8":  # four per register, the lowest index in the lowest byte
        a_loc = "const unsigned w = fa[(r % 8) * 4 + (kk % 16) / 4][fm][r / 8 + 2 * (kk / 16)];"
        b_loc = "const unsigned w = fb[n * 4 + (kk % 16) / 4][fn][kk / 16];"
        a_val = b_val = "(int)(signed char)(w >> (8 * (kk % 4)))"
    elif ptx == "tf32":  # one value per register: A[r][k] in lane (r % 8) * 4 + k % 4
        a_loc = "const unsigned w = fa[(r % 8) * 4 + kk % 4][fm][r / 8 + 2 * (kk / 4)];"
        b_loc = "const unsigned w = fb[n * 4 + kk % 4][fn][kk / 4];"
        a_val = b_val = value
    else:  # two per register, the lower index in the lower half
        a_loc = ("const unsigned w = fa[(r % 8) * 4 + (kk % 8) / 2][fm][r / 8 + 2 * (kk / 8)];"
                 " const unsigned h = kk % 2 ? w >> 16 : w & 0xffffu;")
        b_loc = ("const unsigned w = fb[n * 4 + (kk % 8) / 2][fn][kk / 8];"
                 " const unsigned h = kk % 2 ? w >> 16 : w & 0xffffu;")
        a_val = b_val = value
    return r"""
#ifndef CB_MMA_HELPERS_CPU
#define CB_MMA_HELPERS_CPU
#include <cstring>
// ldmatrix.x4 as lane `lane` receives it: register j holds word lane % 4 of the row that
// lane 8 j + lane / 4 names (.trans: the 16-bit values of column lane / 4 in the rows
// that lanes 8 j + 2 (lane % 4) and the next name, the first in the lower half).
template <bool TRANS, class F>
static inline void cb_ldsm_x4(unsigned (&r)[4], const char* base, F addr, int lane) {
    for (int j = 0; j < 4; ++j) {
        if (!TRANS) {
            std::memcpy(&r[j], base + addr(8 * j + lane / 4) + 4 * (lane % 4), 4);
        } else {
            uint16_t lo, hi;
            std::memcpy(&lo, base + addr(8 * j + 2 * (lane % 4)) + 2 * (lane / 4), 2);
            std::memcpy(&hi, base + addr(8 * j + 2 * (lane % 4) + 1) + 2 * (lane / 4), 2);
            r[j] = (unsigned)lo | ((unsigned)hi << 16);
        }
    }
}
// The byte of lane ln's value in a 128-byte block of a blocked tile: value ln / 4 of row
// ln % 4.
static inline int cb_lds_lane(int ln) { return ((ln & 3) * 8 + (ln >> 2)) * 4; }
// Four 32-bit loads, register j of lane `lane` from byte addr(lane, j) (N-major TF32).
template <class F>
static inline void cb_lds_x4(unsigned (&r)[4], const char* base, F addr, int lane) {
    for (int j = 0; j < 4; ++j) std::memcpy(&r[j], base + addr(lane, j), 4);
}
#endif
""" + TF32_CPU + f"""
// mma.sync m16n8k{k} as lane `lane` sees it: its sums C[g + 8 (i / 2)][2 t + i % 2] of
// tile (fm, fn), each A[r][k] and B[k][n] taken from the lane and register where PTX's
// fragment layout puts it.
template <class FA, class FB>
static inline void cb_mma_emulated({s.acc_t}* d, int lane, const FA& fa, const FB& fb, int fm, int fn) {{
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {{
        const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
        {s.acc_t} sum = d[i];
        for (int kk = 0; kk < {k}; ++kk) {{
            {s.acc_t} av, bv;
            {{ {a_loc} av = {a_val}; }}
            {{ {b_loc} bv = {b_val}; }}
            sum += av * bv;
        }}
        d[i] = sum;
    }}
}}
"""
