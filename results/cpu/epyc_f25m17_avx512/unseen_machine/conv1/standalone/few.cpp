#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#ifndef VL
#define VL 16
#endif
typedef float fv __attribute__((vector_size(4 * VL)));
typedef float fvu __attribute__((vector_size(4 * VL), aligned(4)));
static constexpr long N = 2, C = 4, K = 32, D = 64, H = 64, W = 64, KD = 3, KH = 3, KW = 3, S = 1, PD = 1, PH = 1, PW = 1;
static constexpr long OD = (D + 2 * PD - KD) / S + 1, OH = (H + 2 * PH - KH) / S + 1, OW = (W + 2 * PW - KW) / S + 1;
#ifndef NV
#define NV 2
#endif
#ifndef PB
#define PB 8
#endif
#ifndef NT
#define NT 0
#endif
static constexpr int CW = NV * VL;

// acc[p][v] += x[(p S + kw) C + c] * w[tap][c][v]
template <int P, bool EDGE>
static inline __attribute__((always_inline)) void block(const float* __restrict x, const float* __restrict wp,
    float* __restrict y, long b, long od, long oh, long ow0, long kb) {
    fv acc[P][NV];
    #pragma GCC unroll 32
    for (int p = 0; p < P; ++p)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[p][v] = (fv){};
    for (long kd = 0; kd < KD; ++kd) {
        long id = od * S + kd - PD;
        if (id < 0 || id >= D) continue;
        for (long kh = 0; kh < KH; ++kh) {
            long ih = oh * S + kh - PH;
            if (ih < 0 || ih >= H) continue;
            const float* row = x + ((b * D + id) * H + ih) * W * C;
            const float* wt = wp + ((kb * KD + kd) * KH + kh) * KW * C * CW;
            long iw0 = ow0 * S - PW;
            #pragma GCC unroll 8
            for (int kw = 0; kw < KW; ++kw)
                #pragma GCC unroll 8
                for (int c = 0; c < C; ++c) {
                    fv wv[NV];
                    #pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) {
#if ASM5
                        __asm__ volatile("vmovups %c2(%1), %0" : "=x"(wv[v]) : "r"(wt), "i"(((kw * C + c) * CW + v * VL) * 4));
#elif ASM4
                        __asm__ volatile("vmovups %1, %0" : "=x"(wv[v]) : "m"(*(const fvu*)(wt + (kw * C + c) * CW + v * VL)));
#else
                        wv[v] = *(const fvu*)(wt + (kw * C + c) * CW + v * VL);
#endif
                    }
                    #pragma GCC unroll 32
                    for (int p = 0; p < P; ++p) {
                        long iw = iw0 + p * S + kw;
                        if (EDGE && (iw < 0 || iw >= W)) continue;
#if ASM
                        #pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v)
                            __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc[p][v]) : "v"(wv[v]), "m"(row[iw * C + c]));
#elif ASM2
                        fv xb = (fv)_mm256_broadcast_ss(row + iw * C + c);
                        #pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v)
                            __asm__("vfmadd231ps %2, %1, %0" : "+x"(acc[p][v]) : "x"(wv[v]), "x"(xb));
#elif ASM5
                        { fv t;
                        __asm__ volatile("vbroadcastss %c2(%1), %0" : "=x"(t) : "r"(row + iw0 * C), "i"(((p * S + kw) * C + c) * 4));
                        #pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v)
                            __asm__ volatile("vfmadd231ps %2, %1, %0" : "+x"(acc[p][v]) : "x"(wv[v]), "x"(t));
                        }
#elif ASM4
                        { fv t;
                        __asm__ volatile("vbroadcastss %1, %0" : "=x"(t) : "m"(row[iw * C + c]));
                        #pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v)
                            __asm__ volatile("vfmadd231ps %2, %1, %0" : "+x"(acc[p][v]) : "x"(wv[v]), "x"(t));
                        }
#elif ASM3
                        { fv t;
                        if (NV == 2)
                        __asm__("vbroadcastss %4, %2\n\tvfmadd231ps %2, %5, %0\n\tvfmadd231ps %2, %6, %1"
                                : "+x"(acc[p][0]), "+x"(acc[p][NV > 1 ? 1 : 0]), "=&x"(t) : "0"(acc[p][0]), "m"(row[iw * C + c]), "x"(wv[0]), "x"(wv[NV > 1 ? 1 : 0]));
                        }
#elif INTR
                        __m256 xb = _mm256_broadcast_ss(row + iw * C + c);
                        #pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v)
                            acc[p][v] = (fv)_mm256_fmadd_ps(xb, (__m256)wv[v], (__m256)acc[p][v]);
#else
                        float xv = row[iw * C + c];
                        #pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v) acc[p][v] += xv * wv[v];
#endif
                    }
                }
        }
    }
    float* out = y + (((b * OD + od) * OH + oh) * OW + ow0) * K + kb * CW;
    #pragma GCC unroll 32
    for (int p = 0; p < P; ++p)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
#if NT
#if VL == 16
            _mm512_stream_ps(out + p * K + v * VL, (__m512)acc[p][v]);
#else
            _mm256_stream_ps(out + p * K + v * VL, (__m256)acc[p][v]);
#endif
#else
            *(fvu*)(out + p * K + v * VL) = acc[p][v];
#endif
        }
}

void conv(const float* x, const float* wp, float* y) {
    constexpr long NB = OW / PB, REM = OW % PB;
    #pragma omp parallel for collapse(3) schedule(static)
    for (long b = 0; b < N; ++b)
    for (long od = 0; od < OD; ++od)
    for (long oh = 0; oh < OH; ++oh)
    for (long kb = 0; kb < K / CW; ++kb) {
        for (long ob = 0; ob < NB; ++ob) {
            long ow0 = ob * PB;
            bool edge = ow0 * S - PW < 0 || (ow0 + PB - 1) * S + KW - 1 - PW >= W;
            if (edge) block<PB, true>(x, wp, y, b, od, oh, ow0, kb);
            else block<PB, false>(x, wp, y, b, od, oh, ow0, kb);
        }
        if constexpr (REM > 0) block<REM, true>(x, wp, y, b, od, oh, NB * PB, kb);
    }
#if NT
    _mm_sfence();
#endif
}

int main() {
    std::vector<float> x(N * D * H * W * C), w(K * KD * KH * KW * C), wp(w.size());
    float* y = (float*)aligned_alloc(64, N * OD * OH * OW * K * 4);
    srand(1);
    for (auto& v : x) v = rand() / (float)RAND_MAX - 0.5f;
    for (auto& v : w) v = rand() / (float)RAND_MAX - 0.5f;
    // w: K x taps x C  ->  wp[kb][tap][c][CW]
    for (long k = 0; k < K; ++k) for (long t = 0; t < KD * KH * KW; ++t) for (long c = 0; c < C; ++c)
        wp[(((k / CW) * KD * KH * KW + t) * C + c) * CW + k % CW] = w[(k * KD * KH * KW + t) * C + c];
    conv(x.data(), wp.data(), y);
    // check a few outputs
    double maxerr = 0;
    for (int s = 0; s < 2000; ++s) {
        long b = rand() % N, od = rand() % OD, oh = rand() % OH, ow = rand() % OW, k = rand() % K;
        double r = 0;
        for (long kd = 0; kd < KD; ++kd) for (long kh = 0; kh < KH; ++kh) for (long kw = 0; kw < KW; ++kw) {
            long id = od*S+kd-PD, ih = oh*S+kh-PH, iw = ow*S+kw-PW;
            if (id<0||id>=D||ih<0||ih>=H||iw<0||iw>=W) continue;
            for (long c = 0; c < C; ++c) r += (double)x[(((b*D+id)*H+ih)*W+iw)*C+c] * w[(k*27+(kd*3+kh)*3+kw)*C+c];
        }
        maxerr = std::max(maxerr, std::abs(r - y[(((b*OD+od)*OH+oh)*OW+ow)*K+k]));
    }
    std::vector<double> ts;
    for (int it = 0; it < 25; ++it) {
        auto t0 = std::chrono::steady_clock::now();
        conv(x.data(), wp.data(), y);
        ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    double fl = 2.0 * N * K * C * KD * KH * KW * OD * OH * OW;
    printf("PB=%d NV=%d NT=%d VL=%d: median %.2f ms min %.2f  %.1f GF/s  maxerr %.2e\n", PB, NV, NT, VL, ts[12], ts[0], fl / ts[12] / 1e6, maxerr);
}
