// The bfloat16 convolutions on AMX tiles (tdpbf16ps) for the CPU, on NDHWC: the forward
// (directConvNDHWCamx) and, on the transposed layer with AX_FLIP, the data gradient
// (directConvNDHWCamxBwdData); the filter gradient (directConvNDHWCamxBwdFilter).
// Included by content after a prelude of compile-time constants that the generator
// writes for one layer (global_code):
//   the layer      AX_N AX_C AX_K AX_D AX_H AX_W AX_KD AX_KH AX_KW AX_PD AX_PH AX_PW
//                  AX_OD AX_OH AX_OW (stride 1; for the data gradient the transposed layer)
//   the grid       AX_DP AX_HP AX_WP (padded extents), AX_PL (a padded plane's pixels),
//                  AX_QB AX_QP (blocks of 32 positions q per plane, and their positions),
//                  AX_OFF (the largest tap offset on the grid), AX_SLACK (pixels read past
//                  the last plane), AX_SP (pairs per plane of the filter gradient's input):
//                  amx.py's Grid, which also sizes the buffers
//   the switches   AX_FLIP (w is the original filter of a transposed layer, read flipped
//                  in space with its channels swapped), AX_EMULATE (the tile instructions
//                  computed in C++, for CPUs without AMX: tests), AX_PLANT (tests only).
//
// The tiles: 8 registers of 16 rows x 64 bytes.  tdpbf16ps C += A B takes A as 16 rows of
// 16 bfloat16 pairs (32 values of the reduction), B as 16 rows of 16 columns x one pair
// (the same 32 reduction values, paired), and adds to each float32 C[m][n] the 32 products
// A[m][2r + e] B[r][2n + e].  Every kernel here keeps a 2 x 2 block of C tiles (tmm0-3)
// with two A tiles (tmm4-5) and two B tiles (tmm6-7): four tdpbf16ps per four loads.
//
// The output plane on the padded width.  With stride 1, output pixel (oh, ow) reads the
// padded input at (oh + kh) WP + ow + kw: with q = oh WP + ow that is q + kh WP + kw, one
// stride whatever the row.  So the kernels run over q (OH WP positions, the OW valid ones
// of each row and KW - 1 more), and 16 consecutive q are one A tile loaded with one stride
// from the padded input; the positions past OW are computed and not stored.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <sys/syscall.h>

static constexpr long AX_TAPS = AX_KD * AX_KH * AX_KW;
static constexpr long AX_CC = AX_C / 32;                       // reduction chunks per tap

static inline float ax_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t ax_bf16(float f) {  // to nearest even; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if AX_EMULATE
// The tile registers and instructions in C++, as the Intel SDM defines them for this
// configuration (every tile 16 rows x 64 bytes): what the hardware would compute, so that
// the layouts, the packing and the loops verify on any CPU.
static thread_local unsigned char ax_tmm[8][16][64];

static inline void ax_load(int t, const void* base, long stride) {
    for (int r = 0; r < 16; ++r)
        std::memcpy(ax_tmm[t][r], static_cast<const unsigned char*>(base) + r * stride, 64);
}
static inline void ax_store(int t, void* base, long stride) {
    for (int r = 0; r < 16; ++r)
        std::memcpy(static_cast<unsigned char*>(base) + r * stride, ax_tmm[t][r], 64);
}
static inline void ax_dp(int c, int a, int b) {
    for (int m = 0; m < 16; ++m) {
        float acc[16];
        uint16_t A[32];
        std::memcpy(acc, ax_tmm[c][m], 64);
        std::memcpy(A, ax_tmm[a][m], 64);
        for (int r = 0; r < 16; ++r) {
            uint16_t B[32];
            std::memcpy(B, ax_tmm[b][r], 64);
            for (int n = 0; n < 16; ++n) {
                acc[n] += ax_float(A[2 * r]) * ax_float(B[2 * n]);
                acc[n] += ax_float(A[2 * r + 1]) * ax_float(B[2 * n + 1]);
            }
        }
        std::memcpy(ax_tmm[c][m], acc, 64);
    }
}
#define AX_LOAD(t, base, stride) ax_load(t, base, stride)
#define AX_STORE(t, base, stride) ax_store(t, base, stride)
#define AX_ZERO(t) std::memset(ax_tmm[t], 0, 1024)
#define AX_DP(c, a, b) ax_dp(c, a, b)
static inline void ax_begin() {}
static inline void ax_end() {}
#else
// The instructions themselves (inline assembly: no -mamx flags needed to build).
#define AX_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t :: "r"(base), "r"((long)(stride)) : "memory")
#define AX_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" :: "r"(base), "r"((long)(stride)) : "memory")
#define AX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define AX_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

struct ax_config { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };

static inline void ax_begin() {
    // Linux hands a thread the tile state only once the process asked for it
    static const long granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                        18 /* XFEATURE_XTILEDATA */);
    if (granted != 0) {  // a kernel before Linux 5.16: the first tile instruction would trap
        std::fputs("directConvNDHWCamx*: Linux refused the AMX tile state (arch_prctl)\n", stderr);
        std::abort();
    }
    ax_config cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    __asm__ volatile("ldtilecfg %0" :: "m"(cfg));
}
static inline void ax_end() { __asm__ volatile("tilerelease" ::); }
#endif

// The filter of the forward kernel: wpk[K / 16][tap][C / 32][16 pairs][16 columns][2], one
// B tile per (16 output channels, tap, 32 input channels), from w[K][KD][KH][KW][C] (with
// AX_FLIP: the original filter [C][KD][KH][KW][K] of the transposed layer, flipped).
static void ax_pack_filter(const uint16_t* __restrict w, uint16_t* __restrict wpk, long k16) {
    for (long t = 0; t < AX_TAPS; ++t) {
        const long kd = t / (AX_KH * AX_KW), kh = t / AX_KW % AX_KH, kw = t % AX_KW;
        for (long cc = 0; cc < AX_CC; ++cc)
            for (long p = 0; p < 16; ++p)
                for (long n = 0; n < 16; ++n)
                    for (long e = 0; e < 2; ++e) {
                        const long k = k16 * 16 + n, c = cc * 32 + 2 * p + e;
#if AX_FLIP
                        const long src = (((c * AX_KD + AX_KD - 1 - kd) * AX_KH + AX_KH - 1 - kh)
                                          * AX_KW + AX_KW - 1 - kw) * AX_K + k;
#else
                        const long src = ((k * AX_KD + kd) * AX_KH + kh) * AX_KW * AX_C + kw * AX_C + c;
#endif
#if AX_PLANT == 2
                        const long f = 1 - e;  // planted: the halves of each pair swapped
#else
                        const long f = e;
#endif
                        wpk[((((k16 * AX_TAPS + t) * AX_CC + cc) * 16 + p) * 16 + n) * 2 + f] = w[src];
                    }
    }
}

// One plane of the zero-padded input xp[N][DP][HP][WP][C] (and the slack after the last).
static void ax_pad_plane(const uint16_t* __restrict x, uint16_t* __restrict xp, long b, long dp) {
    uint16_t* plane = xp + (b * AX_DP + dp) * AX_PL * AX_C;
    const long d = dp - AX_PD;
    for (long hp = 0; hp < AX_HP; ++hp)
        for (long wp = 0; wp < AX_WP; ++wp) {
            const long h = hp - AX_PH, w = wp - AX_PW;
            uint16_t* to = plane + (hp * AX_WP + wp) * AX_C;
            if (d < 0 || d >= AX_D || h < 0 || h >= AX_H || w < 0 || w >= AX_W)
                std::memset(to, 0, 2 * AX_C);
            else
                std::memcpy(to, x + (((b * AX_D + d) * AX_H + h) * AX_W + w) * AX_C, 2 * AX_C);
        }
    if (b == AX_N - 1 && dp == AX_DP - 1)
        std::memset(plane + AX_PL * AX_C, 0, 2 * AX_SLACK * AX_C);
}

// One step of every kernel: A tiles a0, a1 (row stride sa bytes) and B tiles b0, b1 (sb)
// loaded, and the four products into the 2 x 2 block of C tiles.
static inline __attribute__((always_inline)) void ax_step(
        const uint16_t* a0, const uint16_t* a1, long sa, const uint16_t* b0,
        const uint16_t* b1, long sb) {
    AX_LOAD(4, a0, sa);
    AX_LOAD(5, a1, sa);
    AX_LOAD(6, b0, sb);
    AX_LOAD(7, b1, sb);
    AX_DP(0, 4, 6);
    AX_DP(1, 4, 7);
    AX_DP(2, 5, 6);
    AX_DP(3, 5, 7);
}

// Store a 2 x 2 block of C tiles (rows: 32 q of the plane or 32 k; columns: 32 channels)
// into out[32][32] floats.
static inline void ax_store_block(float (&out)[32][32]) {
    AX_STORE(0, &out[0][0], 128);
    AX_STORE(1, &out[0][16], 128);
    AX_STORE(2, &out[16][0], 128);
    AX_STORE(3, &out[16][16], 128);
}

// The forward item: output plane od of sample b, positions q of block qb (32), output
// channels of block kb (32).
static void ax_forward(const uint16_t* __restrict xp, const uint16_t* __restrict wpk,
                       uint16_t* __restrict y, long b, long od, long qb, long kb) {
    ax_begin();
    AX_ZERO(0); AX_ZERO(1); AX_ZERO(2); AX_ZERO(3);
    const long q0 = qb * 32;
    for (long kd = 0; kd < AX_KD; ++kd)
        for (long kh = 0; kh < AX_KH; ++kh)
            for (long kw = 0; kw < AX_KW; ++kw) {
                const long t = (kd * AX_KH + kh) * AX_KW + kw;
#if AX_PLANT == 1
                if (t == AX_TAPS - 1) continue;  // planted: the last tap dropped
#endif
                const uint16_t* a = xp + ((b * AX_DP + od + kd) * AX_PL + q0 + kh * AX_WP + kw) * AX_C;
                const uint16_t* bt = wpk + (2 * kb * AX_TAPS + t) * AX_CC * 512;
                for (long cc = 0; cc < AX_CC; ++cc)
                    ax_step(a + cc * 32, a + 16 * AX_C + cc * 32, 2 * AX_C, bt + cc * 512,
                            bt + AX_TAPS * AX_CC * 512 + cc * 512, 64);
            }
    float out[32][32];
    ax_store_block(out);
    ax_end();
    for (long r = 0; r < 32; ++r) {
        const long q = q0 + r, oh = q / AX_WP, ow = q % AX_WP;
        if (oh >= AX_OH || ow >= AX_OW) continue;
        uint16_t* to = y + (((b * AX_OD + od) * AX_OH + oh) * AX_OW + ow) * AX_K + kb * 32;
        for (long n = 0; n < 32; ++n) to[n] = ax_bf16(out[r][n]);
    }
}

// The filter gradient's operands.  dL/dy transposed per plane, dyt[N][OD][K][QP]: the
// A tile of 16 output channels x 32 positions q is 16 rows of one stride; zero at the
// positions past OW and past the plane.
static void ax_transpose_dy(const uint16_t* __restrict dy, uint16_t* __restrict dyt, long b, long od) {
    uint16_t* plane = dyt + (b * AX_OD + od) * AX_K * AX_QP;
    std::memset(plane, 0, 2 * AX_K * AX_QP);
    for (long oh = 0; oh < AX_OH; ++oh)
        for (long ow = 0; ow < AX_OW; ++ow) {
            const uint16_t* from = dy + (((b * AX_OD + od) * AX_OH + oh) * AX_OW + ow) * AX_K;
            for (long k = 0; k < AX_K; ++k) plane[k * AX_QP + oh * AX_WP + ow] = from[k];
        }
}

// The input in pairs of consecutive padded pixels, both alignments, per plane:
// xpairs[parity][N][DP][AX_SP][C][2] holds (X(2s + parity), X(2s + parity + 1)), with X(s)
// the padded plane's pixel s (zero past the plane).  The B tile of 32 positions from an
// offset of either parity is then 16 rows (pairs) of one stride.
static void ax_pair_input(const uint16_t* __restrict x, uint16_t* __restrict xpairs, long b, long dp) {
    const long d = dp - AX_PD;
    for (long parity = 0; parity < 2; ++parity) {
        uint16_t* plane = xpairs + ((parity * AX_N + b) * AX_DP + dp) * AX_SP * AX_C * 2;
        for (long s = 0; s < AX_SP; ++s)
            for (long e = 0; e < 2; ++e) {
                const long pix = 2 * s + parity + e, hp = pix / AX_WP, wp = pix % AX_WP;
                const long h = hp - AX_PH, w = wp - AX_PW;
                const bool inside = pix < AX_PL && d >= 0 && d < AX_D && h >= 0 && h < AX_H
                                    && w >= 0 && w < AX_W;
                const uint16_t* from = x + (((b * AX_D + d) * AX_H + h) * AX_W + w) * AX_C;
#if AX_PLANT == 2
                const long f = 1 - e;  // planted: the halves of each pair swapped
#else
                const long f = e;
#endif
                for (long c = 0; c < AX_C; ++c)
                    plane[(s * AX_C + c) * 2 + f] = inside ? from[c] : (uint16_t)0;
            }
    }
}

// The filter-gradient item: tap t, output channels of block kb (32), input channels of
// block cb (32), summed over every sample, plane and position.
static void ax_filter_gradient(const uint16_t* __restrict dyt, const uint16_t* __restrict xpairs,
                               uint16_t* __restrict dw, long t, long kb, long cb) {
    const long kd = t / (AX_KH * AX_KW), kh = t / AX_KW % AX_KH, kw = t % AX_KW;
    const long off = kh * AX_WP + kw, parity = off & 1;
    ax_begin();
    AX_ZERO(0); AX_ZERO(1); AX_ZERO(2); AX_ZERO(3);
    for (long b = 0; b < AX_N; ++b)
        for (long od = 0; od < AX_OD; ++od) {
            const uint16_t* a = dyt + ((b * AX_OD + od) * AX_K + kb * 32) * AX_QP;
            const uint16_t* pairs = xpairs + ((parity * AX_N + b) * AX_DP + od + kd) * AX_SP * AX_C * 2
                                    + cb * 64;
            for (long q0 = 0; q0 < AX_QP; q0 += 32) {
#if AX_PLANT == 1
                if (q0 == AX_QP - 32) continue;  // planted: the last block of positions dropped
#endif
                const uint16_t* bt = pairs + (q0 + off - parity) / 2 * AX_C * 2;
                ax_step(a + q0, a + 16 * AX_QP + q0, 2 * AX_QP, bt, bt + 32, 4 * AX_C);
            }
        }
    float out[32][32];
    ax_store_block(out);
    ax_end();
    for (long m = 0; m < 32; ++m)
        for (long n = 0; n < 32; ++n)
            dw[((kb * 32 + m) * AX_TAPS + t) * AX_C + cb * 32 + n] = ax_bf16(out[m][n]);
}
