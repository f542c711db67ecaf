// Half-width storage types of convbench builds: the compilers include this file first in
// every float16 and bfloat16 build (convbench.toolchain.dace_settings).
//
// A value is stored in 16 bits and becomes a float when read, so a kernel that widens
// its operands before multiplying accumulates in float32.  Products of two float16 or
// two bfloat16 numbers are exact in float32 (11 x 11 and 8 x 8 significand bits), so
// the only roundings are the float32 sums and the final store, which rounds to nearest
// even.  DaCe's own CPU float16 cannot serve: it truncates on the way in and converts
// the bit pattern as an integer on the way out.
#ifndef CONVBENCH_HALFPREC_H
#define CONVBENCH_HALFPREC_H

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define CB_HD __host__ __device__ __forceinline__
#else
#if defined(__F16C__)
#include <immintrin.h>
#endif
#define CB_HD inline
#endif

CB_HD float cb_float_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
CB_HD uint32_t cb_bits_from_float(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

// bfloat16 is the upper half of a float32.
CB_HD float cb_bf16_to_float(uint16_t h) { return cb_float_from_bits((uint32_t)h << 16); }
CB_HD uint16_t cb_float_to_bf16(float f) {
    uint32_t u = cb_bits_from_float(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN stays NaN (quiet)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // to nearest, ties to even
}

// IEEE binary16, portable versions (hardware instructions below where there are some).
CB_HD float cb_half_to_float_soft(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1fu) return cb_float_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {  // zero or subnormal: man * 2^-24
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return cb_float_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}
CB_HD uint16_t cb_float_to_half_soft(float f) {
    uint32_t u = cb_bits_from_float(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);        // NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);       // rounds to infinity
    if (a < 0x38800000u) {  // below 2^-14: subnormal, in units of 2^-24, to nearest even
        float v = cb_float_from_bits(a) * 16777216.0f;              // exact: a power of two
        uint32_t q = (uint32_t)v;
        float rest = v - (float)q;
        if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u;                                  // rebias 127 -> 15
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;                      // to nearest, ties to even
    return (uint16_t)(sign | r);
}

CB_HD float cb_half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#elif defined(__F16C__) && !defined(__CUDACC__)
    return _cvtsh_ss(h);
#else
    return cb_half_to_float_soft(h);
#endif
}
CB_HD uint16_t cb_float_to_half(float f) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#elif defined(__F16C__) && !defined(__CUDACC__)
    return (uint16_t)_cvtss_sh(f, 0);  // 0: round to nearest even
#else
    return cb_float_to_half_soft(f);
#endif
}

// The storage types.  Their only arithmetic is the conversion to float, so any
// expression on them is evaluated in float32; trivial default construction keeps them
// usable in arrays, shared memory and registers.
struct cb_half {
    uint16_t bits;
    cb_half() = default;
    CB_HD cb_half(float f) : bits(cb_float_to_half(f)) {}
    CB_HD operator float() const { return cb_half_to_float(bits); }
};
struct cb_bfloat16 {
    uint16_t bits;
    cb_bfloat16() = default;
    CB_HD cb_bfloat16(float f) : bits(cb_float_to_bf16(f)) {}
    CB_HD operator float() const { return cb_bf16_to_float(bits); }
};

#endif  // CONVBENCH_HALFPREC_H
