// The exact int8 Winograd F(2^3, 3^3) forward on NDHWC (winogradF2int8).  Included by content
// after the int8 kernels' ISA helpers (cb_vi, cb_zero, cb_bcast, cb_load, cb_store32,
// cb_store8: convkernels/cpu/direct/int8_dot.py), a 16-bit dot product cb_dot16 and a prelude
// of constants (convkernels/cpu/winograd/int8.py):
//   the layer: WQ_N, WQ_C (even), WQ_K, WQ_D, WQ_H, WQ_W, the front padding WQ_PD, WQ_PH,
//     WQ_PW, the output WQ_OD, WQ_OH, WQ_OW; tiles per axis WQ_TD, WQ_TH, WQ_TW, WQ_COUNT in all;
//   the blocking: WQ_T tiles per block, WQ_RT tiles per register block, WQ_NV vectors of
//     WQ_VL int32 lanes (WQ_KBW = WQ_NV WQ_VL output channels per block), WQ_KQ blocks per
//     work item; WQ_VB bytes per vector; WQ_GROUP (1: the GEMMs and the output transform
//     per group of WQ_RT tiles, 0: per block);
//   WQ_OUT (0: the int32 sums, 1: requantized to uint8), WQ_PLANT (1: the last transform
//     point is dropped).
// Transform point p = (pd 4 + ph) 4 + pw.  V[p][t][c] = B^T d (d = x - zx, zero outside),
// U = (2G) g (2G)^T (packed by the caller), M[p][t][k] = sum_c V U, and
// y = (A^T M A) / 8: every step is integer, the division exact.  Sums that leave int32
// wrap, and wrap back: the arithmetic is modulo 2^32, and the result fits.
#include <vector>

static constexpr int WQ_P = 64;
static constexpr int WQ_C2 = WQ_C / 2;
// vectors of WQ_VB bytes: int16 (the input transform, widened from uint8) and uint32 (the
// output transform, whose sums wrap as the modulo-2^32 argument wants)
static constexpr int WQ_HL = WQ_VB / 2, WQ_IL = WQ_VB / 4;
typedef int16_t wq_h __attribute__((vector_size(WQ_VB), aligned(2)));
typedef uint8_t wq_b __attribute__((vector_size(WQ_VB / 2), aligned(1)));
typedef uint32_t wq_u __attribute__((vector_size(WQ_VB), aligned(4)));
typedef int32_t wq_s __attribute__((vector_size(WQ_VB), aligned(4)));

// the tile's first output pixel (batch nb, depth d0, height h0, width w0)
static inline void wq_tile(long i, long& nb, long& d0, long& h0, long& w0) {
    w0 = 2 * (i % WQ_TW);
    h0 = 2 * (i / WQ_TW % WQ_TH);
    d0 = 2 * (i / (WQ_TW * WQ_TH) % WQ_TD);
    nb = i / (WQ_TW * WQ_TH * WQ_TD);
}

// B^T of F(2, 3) along one axis of four values, in place
template <class T>
static inline __attribute__((always_inline)) void wq_bt4(T& a, T& b, T& c, T& d) {
    const T o0 = a - c, o1 = b + c, o2 = c - b, o3 = b - d;
    a = o0; b = o1; c = o2; d = o3;
}

// B^T along depth, height and width of the 64 points s[(d 4 + h) 4 + w], in place
template <class T>
static inline __attribute__((always_inline)) void wq_bt3(T (&s)[64]) {
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) wq_bt4(s[r], s[16 + r], s[32 + r], s[48 + r]);
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
        const int b = (r / 4) * 16 + r % 4;
        wq_bt4(s[b], s[b + 4], s[b + 8], s[b + 12]);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) wq_bt4(s[4 * r], s[4 * r + 1], s[4 * r + 2], s[4 * r + 3]);
}

// one tile's V (Vt: its row of point 0; row stride WQ_T C per point) from the patch at
// base (x at the tile's corner): per vector of channels the 4^3 values of d = x - zx
// (zero where ok is false: past the border; INSIDE: every one inside) widened into
// registers, B^T three times, the 64 points stored; channels past the last whole vector
// one by one
template <bool INSIDE>
static inline void wq_patch(const uint8_t* __restrict base, int zx, const bool (&ok)[64],
                            int16_t* __restrict Vt) {
    constexpr long QD = (long)WQ_H * WQ_W * WQ_C, QH = (long)WQ_W * WQ_C;
    const wq_h z = (wq_h){} + (int16_t)zx;
    int c = 0;
    for (; c + WQ_HL <= WQ_C; c += WQ_HL) {
        wq_h s[64];
        #pragma GCC unroll 64
        for (int q = 0; q < 64; ++q) {
            const uint8_t* src = base + (q / 16) * QD + (q / 4 % 4) * QH + (q % 4) * WQ_C + c;
            s[q] = (INSIDE || ok[q]) ? __builtin_convertvector(*(const wq_b*)src, wq_h) - z
                                     : (wq_h){};
        }
        wq_bt3(s);
        #pragma GCC unroll 64
        for (int q = 0; q < 64; ++q) *(wq_h*)(Vt + (long)q * WQ_T * WQ_C + c) = s[q];
    }
    for (; c < WQ_C; ++c) {
        int16_t s[64];
        for (int q = 0; q < 64; ++q)
            s[q] = (INSIDE || ok[q])
                ? (int16_t)((int)base[(q / 16) * QD + (q / 4 % 4) * QH + (q % 4) * WQ_C + c] - zx)
                : (int16_t)0;
        wq_bt3(s);
        for (int q = 0; q < 64; ++q) Vt[(long)q * WQ_T * WQ_C + c] = s[q];
    }
}

// V[p][t][C] of the block's tiles from tile0 (zeros past the last tile)
static void wq_input(const uint8_t* __restrict x, int zx, int16_t* __restrict V, long tile0) {
    for (int t = 0; t < WQ_T; ++t) {
        const long i = tile0 + t;
        int16_t* Vt = V + (long)t * WQ_C;
        if (i >= WQ_COUNT) {
            for (int p = 0; p < WQ_P; ++p)
                std::memset(Vt + (long)p * WQ_T * WQ_C, 0, sizeof(int16_t) * WQ_C);
            continue;
        }
        long nb, d0, h0, w0;
        wq_tile(i, nb, d0, h0, w0);
        d0 -= WQ_PD; h0 -= WQ_PH; w0 -= WQ_PW;
        // the patch's corner; on the border it may lie outside x (never read there)
        const uint8_t* base = x + (((nb * WQ_D + d0) * WQ_H + h0) * WQ_W + w0) * WQ_C;
        bool ok[64];
        if (d0 >= 0 && h0 >= 0 && w0 >= 0 && d0 + 4 <= WQ_D && h0 + 4 <= WQ_H && w0 + 4 <= WQ_W) {
            wq_patch<true>(base, zx, ok, Vt);
            continue;
        }
        bool od[4], oh[4], ow[4];
        for (int j = 0; j < 4; ++j) {
            od[j] = d0 + j >= 0 && d0 + j < WQ_D;
            oh[j] = h0 + j >= 0 && h0 + j < WQ_H;
            ow[j] = w0 + j >= 0 && w0 + j < WQ_W;
        }
        for (int q = 0; q < 64; ++q) ok[q] = od[q / 16] && oh[q / 4 % 4] && ow[q % 4];
        wq_patch<false>(base, zx, ok, Vt);
    }
}

// M[r][KBW] = sum_c V[r][c] U[c][KBW] for RR tiles: per channel pair, NV vectors of U and
// RR x NV 16-bit dot products into int32 lanes, each with its tile's pair of V broadcast
template <int RR>
static inline __attribute__((always_inline)) void wq_gemm(
        const int16_t* __restrict v, const int16_t* __restrict u, int32_t* __restrict m) {
    cb_vi acc[RR][WQ_NV];
    #pragma GCC unroll 16
    for (int r = 0; r < RR; ++r)
        #pragma GCC unroll 8
        for (int q = 0; q < WQ_NV; ++q) acc[r][q] = cb_zero();
    for (int c2 = 0; c2 < WQ_C2; ++c2) {
        cb_vi w[WQ_NV];
        #pragma GCC unroll 8
        for (int q = 0; q < WQ_NV; ++q) w[q] = cb_load(u + ((long)c2 * WQ_KBW + q * WQ_VL) * 2);
        #pragma GCC unroll 16
        for (int r = 0; r < RR; ++r)
            #pragma GCC unroll 8
            for (int q = 0; q < WQ_NV; ++q)
                acc[r][q] = cb_dot16(acc[r][q], w[q], v + (long)r * WQ_C + 2 * c2);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < RR; ++r)
        #pragma GCC unroll 8
        for (int q = 0; q < WQ_NV; ++q) cb_store32(m + (long)r * WQ_KBW + q * WQ_VL, acc[r][q]);
}

// the sums M[p][t][KBW] of `tiles` tiles from tile0, output channels k0.., to y: per tile and vector of
// channels, A^T along depth as the points are loaded, then along height and width in
// registers, 8 y shifted right by 3 (exact), stored (int32) or requantized (uint8)
template <long PS>  // between transform points
static void wq_output(const int32_t* __restrict M, void* __restrict yv, long tile0, int tiles,
                      long k0, const float* qs, int zy) {
    for (int t = 0; t < tiles; ++t) {
        const long i = tile0 + t;
        if (i >= WQ_COUNT) break;
        long nb, d0, h0, w0;
        wq_tile(i, nb, d0, h0, w0);
        for (int kv = 0; kv < WQ_KBW; kv += WQ_IL) {
            const int32_t* m = M + (long)t * WQ_KBW + kv;
            for (int od = 0; od < 2 && d0 + od < WQ_OD; ++od) {
                wq_u s[16];  // (ph, pw) after A^T along depth
                #pragma GCC unroll 16
                for (int r = 0; r < 16; ++r) {
                    const wq_u x1 = *(const wq_u*)(m + (16 + r) * PS);
                    const wq_u x2 = *(const wq_u*)(m + (32 + r) * PS);
                    s[r] = od == 0 ? *(const wq_u*)(m + r * PS) + x1 + x2
                                   : x1 - x2 - *(const wq_u*)(m + (48 + r) * PS);
                }
                wq_u hh[2][4];  // (oh, pw)
                #pragma GCC unroll 4
                for (int pw = 0; pw < 4; ++pw) {
                    hh[0][pw] = s[pw] + s[4 + pw] + s[8 + pw];
                    hh[1][pw] = s[4 + pw] - s[8 + pw] - s[12 + pw];
                }
                #pragma GCC unroll 2
                for (int oh = 0; oh < 2; ++oh)
                    #pragma GCC unroll 2
                    for (int ow = 0; ow < 2; ++ow) {
                        if (h0 + oh >= WQ_OH || w0 + ow >= WQ_OW) continue;  // a cut-short tile
                        const wq_u* r = hh[oh];
                        const wq_u y8 = ow == 0 ? r[0] + r[1] + r[2] : r[1] - r[2] - r[3];
                        const wq_s v = ((wq_s)y8) >> 3;  // exact: 8 y
                        const long at = (((nb * WQ_OD + d0 + od) * WQ_OH + h0 + oh) * WQ_OW
                                         + w0 + ow) * WQ_K + k0 + kv;
                        if (WQ_OUT == 0)
                            cb_store32(static_cast<int32_t*>(yv) + at, (cb_vi)v);
                        else
                            cb_store8(static_cast<uint8_t*>(yv) + at, (cb_vi)v, qs + k0 + kv,
                                      qs + WQ_K + k0 + kv, zy);
                    }
            }
        }
    }
}

// one work item: tiles [tb T, tb T + T) x output channel blocks [kq KQ, kq KQ + KQ)
static void wq_item(const uint8_t* x, const int16_t* U, const int* zp, const float* qs,
                    void* y, long tb, long kq) {
    constexpr int RT = WQ_RT, REM = WQ_T % WQ_RT;
    static thread_local std::vector<int16_t> vbuf;
    static thread_local std::vector<int32_t> mbuf;
    if ((long)vbuf.size() < (long)WQ_P * WQ_T * WQ_C) vbuf.resize((long)WQ_P * WQ_T * WQ_C);
    if ((long)mbuf.size() < (long)WQ_P * WQ_T * WQ_KBW) mbuf.resize((long)WQ_P * WQ_T * WQ_KBW);
    wq_input(x, zp[0], vbuf.data(), tb * WQ_T);
    const int16_t* V = vbuf.data();
    int32_t* M = mbuf.data();
    for (long kb = kq * WQ_KQ; kb < (kq + 1) * WQ_KQ; ++kb) {
        const int16_t* Ub = U + kb * WQ_P * (long)WQ_C2 * WQ_KBW * 2;
        if (WQ_GROUP) {  // per group of RT tiles: its sums (64 RT KBW) stay in L1
            for (int t = 0; t < WQ_T; t += RT) {
                for (int p = 0; p < WQ_P - WQ_PLANT; ++p) {
                    const int16_t* v = V + (long)p * WQ_T * WQ_C + (long)t * WQ_C;
                    const int16_t* u = Ub + p * (long)WQ_C2 * WQ_KBW * 2;
                    int32_t* m = M + (long)p * RT * WQ_KBW;
                    if (REM && t + RT > WQ_T)
                        wq_gemm<(REM ? REM : 1)>(v, u, m);
                    else
                        wq_gemm<RT>(v, u, m);
                }
                if (WQ_PLANT)
                    std::memset(M + (long)(WQ_P - 1) * RT * WQ_KBW, 0, sizeof(int32_t) * RT * WQ_KBW);
                wq_output<(long)RT * WQ_KBW>(M, y, tb * WQ_T + t, t + RT > WQ_T ? REM : RT,
                                             kb * WQ_KBW, qs, zp[1]);
            }
            continue;
        }
        for (int p = 0; p < WQ_P - WQ_PLANT; ++p) {  // the block's sums, then its outputs
            const int16_t* Vp = V + (long)p * WQ_T * WQ_C;
            const int16_t* Up = Ub + p * (long)WQ_C2 * WQ_KBW * 2;
            int32_t* Mp = M + (long)p * WQ_T * WQ_KBW;
            for (int t = 0; t + RT <= WQ_T; t += RT)
                wq_gemm<RT>(Vp + (long)t * WQ_C, Up, Mp + (long)t * WQ_KBW);
            if (REM)
                wq_gemm<(REM ? REM : 1)>(Vp + (long)(WQ_T - REM) * WQ_C, Up,
                                         Mp + (long)(WQ_T - REM) * WQ_KBW);
        }
        if (WQ_PLANT)
            std::memset(M + (long)(WQ_P - 1) * WQ_T * WQ_KBW, 0, sizeof(int32_t) * WQ_T * WQ_KBW);
        wq_output<(long)WQ_T * WQ_KBW>(M, y, tb * WQ_T, WQ_T, kb * WQ_KBW, qs, zp[1]);
    }
}
