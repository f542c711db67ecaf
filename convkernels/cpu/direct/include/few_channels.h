// The CPU forward convolution for few input channels on NDHWC (directConvNDHWCfew).
// Included by content after a prelude of compile-time constants that the generator writes
// for one layer and tile (global_code):
//   the layer      FC_N FC_C FC_K FC_D FC_H FC_W FC_KD FC_KH FC_KW FC_S FC_PD FC_PH FC_PW
//                  FC_OD FC_OH FC_OW;
//   the tile       FC_VL floats per vector (the types fc_v, fc_vu), FC_NV vectors of
//                  output channels (FC_CW = FC_NV FC_VL) times FC_PB output pixels along
//                  the width;
//   the switches   FC_EMBED (the input value broadcast inside the FMA, AVX-512; else
//                  an AVX2 FMA of a broadcast),
//                  FC_STREAM (non-temporal stores), FC_PLANT (a planted error, tests only).
//
// One call computes one output row (b, od, oh) for one block kb of FC_CW output channels:
// the row is cut into blocks of FC_PB pixels (the last one shorter), each an FC_PB x FC_NV
// tile of accumulator vectors that stays in registers through the whole reduction.  For
// one (kd, kh) the KW x C input values a pixel reads lie one after the other in NDHWC
// memory, so the reduction over them is fully unrolled: per (kw, c) FC_NV filter vectors
// are loaded and each pixel's input value is broadcast into FC_NV FMAs.  Blocks that
// touch the width border skip the taps that would read it (a test on constants once the
// pixel and tap loops are unrolled and the block's first column is known).

static constexpr long FC_CW = FC_NV * FC_VL;
static constexpr long FC_TAPS = FC_KD * FC_KH * FC_KW;

// The packed filter: wp[kb][kd][kh][kw][c][FC_CW], the output channels of one block
// contiguous, from w[K][KD][KH][KW][C]; zero past K (a last block that K does not fill).
static inline void fc_pack(const float* __restrict w, float* __restrict wp, long kb) {
    for (long t = 0; t < FC_TAPS; ++t)
        for (long c = 0; c < FC_C; ++c)
            for (long j = 0; j < FC_CW; ++j) {
                const long k = kb * FC_CW + j;
                wp[((kb * FC_TAPS + t) * FC_C + c) * FC_CW + j] =
                    k < FC_K ? w[(k * FC_TAPS + t) * FC_C + c] : 0.0f;
            }
}

// One pixel's step: acc[v] += (the input value at row + off, broadcast) * w[v], for each of
// the FC_NV vectors, in inline assembly.  With AVX-512 the broadcast is the FMA's memory
// operand ({1to16}).  With AVX2 the broadcast (its offset an immediate, "i": a constant
// once the loops are unrolled and this is inlined, so the kernel needs -O2 or more) and
// the FMAs stay in the order written (volatile), so that gcc neither
// hoists every broadcast and filter vector of the row to its top, nor (under -ffast-math)
// rewrites the products, both of which spilled the tile (conv1 at 64^3 b2 on the Zen 4
// EPYC, DaCe's flags: 22.2 ms with `acc += x * w`, against 16.5 ms so).
static inline __attribute__((always_inline)) void fc_pixel(fc_v (&acc)[FC_NV],
                                                           const fc_v (&w)[FC_NV],
                                                           const float* row, long off) {
#if FC_EMBED
    #pragma GCC unroll 8
    for (int v = 0; v < FC_NV; ++v)
        __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc[v]) : "v"(w[v]), "m"(row[off]));
#else
    fc_v t;
    __asm__ volatile("vbroadcastss %c2(%1), %0" : "=x"(t) : "r"(row), "i"(4 * off));
    #pragma GCC unroll 8
    for (int v = 0; v < FC_NV; ++v)
        __asm__ volatile("vfmadd231ps %2, %1, %0" : "+x"(acc[v]) : "x"(w[v]), "x"(t));
#endif
}

// The FC_NV filter vectors of one (kw, c) step.
static inline __attribute__((always_inline)) void fc_filter(fc_v (&w)[FC_NV], const float* wt,
                                                            long off) {
    #pragma GCC unroll 8
    for (int v = 0; v < FC_NV; ++v) {
#if FC_EMBED
        w[v] = *(const fc_vu*)(wt + off + v * FC_VL);
#else
        __asm__ volatile("vmovups %c2(%1), %0" : "=x"(w[v]) : "r"(wt), "i"(4 * (off + v * FC_VL)));
#endif
    }
}

// The vector of output channels k0 .. k0 + FC_VL - 1 of one pixel; those past K are not
// stored (a last block that K does not fill).
static inline __attribute__((always_inline)) void fc_store(float* out, fc_v v, long k0,
                                                           bool stream) {
    if (FC_K % FC_VL && k0 + FC_VL > FC_K) {
        for (long j = 0; j < FC_K - k0; ++j) out[j] = v[j];
        return;
    }
#if FC_STREAM && FC_VL == 16
    if (stream) { _mm512_stream_ps(out, (__m512)v); return; }
#elif FC_STREAM && FC_VL == 8
    if (stream) { _mm256_stream_ps(out, (__m256)v); return; }
#endif
    (void)stream;
    *(fc_vu*)out = v;
}

// One block of P pixels from output column ow0; EDGE: some of its taps read the border.
template <int P, bool EDGE>
static inline __attribute__((always_inline)) void fc_block(
        const float* __restrict x, const float* __restrict wp, float* __restrict y,
        long b, long od, long oh, long ow0, long kb, bool stream) {
    fc_v acc[P][FC_NV];
    #pragma GCC unroll 64
    for (int p = 0; p < P; ++p)
        #pragma GCC unroll 8
        for (int v = 0; v < FC_NV; ++v) acc[p][v] = (fc_v){};
    const long iw0 = ow0 * FC_S - FC_PW;
    for (long kd = 0; kd < FC_KD; ++kd) {
        const long id = od * FC_S + kd - FC_PD;
        if (id < 0 || id >= FC_D) continue;
        for (long kh = 0; kh < FC_KH; ++kh) {
            const long ih = oh * FC_S + kh - FC_PH;
            if (ih < 0 || ih >= FC_H) continue;
#if FC_PLANT == 1
            if (kd == FC_KD - 1 && kh == FC_KH - 1) continue;  // planted: a row of taps dropped
#endif
            const float* row = x + (((b * FC_D + id) * FC_H + ih) * FC_W + iw0) * FC_C;
            const float* wt = wp + ((kb * FC_KD + kd) * FC_KH + kh) * FC_KW * FC_C * FC_CW;
            #pragma GCC unroll 64
            for (int kw = 0; kw < FC_KW; ++kw)
                #pragma GCC unroll 64
                for (int c = 0; c < FC_C; ++c) {
                    fc_v wv[FC_NV];
                    fc_filter(wv, wt, (kw * FC_C + c) * FC_CW);
                    #pragma GCC unroll 64
                    for (int p = 0; p < P; ++p) {
                        if (EDGE) {
                            const long iw = iw0 + p * FC_S + kw;
#if FC_PLANT == 2
                            if (iw < 0 || iw >= FC_W - 1) continue;  // planted: the last column
#else
                            if (iw < 0 || iw >= FC_W) continue;
#endif
                        }
                        fc_pixel(acc[p], wv, row, (p * FC_S + kw) * FC_C + c);
                    }
                }
        }
    }
    float* out = y + (((b * FC_OD + od) * FC_OH + oh) * FC_OW + ow0) * FC_K + kb * FC_CW;
    #pragma GCC unroll 64
    for (int p = 0; p < P; ++p)
        #pragma GCC unroll 8
        for (int v = 0; v < FC_NV; ++v) {
            const long k0 = kb * FC_CW + v * FC_VL;
            if (k0 < FC_K) fc_store(out + p * FC_K + v * FC_VL, acc[p][v], k0, stream);
        }
}

static constexpr long FC_BLOCKS = FC_OW / FC_PB;
static constexpr int FC_REST = FC_OW % FC_PB;

// Whether the block from output column ow0 of P pixels has a tap that reads the border.
static constexpr bool fc_edge(long ow0, long p) {
    return ow0 * FC_S - FC_PW < 0 || (ow0 + p - 1) * FC_S + FC_KW - 1 - FC_PW >= FC_W;
}

static void fc_row(const float* __restrict x, const float* __restrict wp, float* __restrict y,
                   long b, long od, long oh, long kb) {
    // non-temporal stores need aligned vectors: those of y are when y is and K fills them
    const bool stream = FC_STREAM && FC_K % FC_VL == 0
                        && reinterpret_cast<unsigned long>(y) % (4 * FC_VL) == 0;
    for (long ob = 0; ob < FC_BLOCKS; ++ob) {
        const long ow0 = ob * FC_PB;
        if (fc_edge(ow0, FC_PB)) fc_block<FC_PB, true>(x, wp, y, b, od, oh, ow0, kb, stream);
        else fc_block<FC_PB, false>(x, wp, y, b, od, oh, ow0, kb, stream);
    }
    if constexpr (FC_REST > 0)
        fc_block<FC_REST, true>(x, wp, y, b, od, oh, FC_BLOCKS * FC_PB, kb, stream);
#if FC_STREAM
    if (stream) _mm_sfence();  // the row's non-temporal stores ordered before what follows
#endif
}
