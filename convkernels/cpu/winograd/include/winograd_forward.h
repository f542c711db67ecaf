// The CPU kernel of 3D Winograd F(m^3, 3^3) on NDHWC (winogradF2 and, on the transposed
// layer with WG_FLIP, winogradF2BwdData).  Included by content after winograd_common.h
// and a prelude of compile-time constants that its generator writes for one layer and
// blocking (global_code):
//   the transforms WG_AT [m][n], WG_G [n][3], WG_BT [n][n], computed from their points;
//   the layer: WG_C, WG_K input and output channels, WG_D, WG_H, WG_W the input, WG_PD,
//     WG_PH, WG_PW its padding at the front, WG_OD, WG_OH, WG_OW the output;
//   the tiles: WG_M = m, WG_N = m + 2, WG_R = 3, WG_P = n^3 transform points, WG_TD, WG_TH,
//     WG_TW tiles per axis, WG_COUNT tiles in all (over the batch);
//   the blocking (Blocking): WG_T tiles per block, WG_KG output
//     channels per work item, WG_CB input channels per chunk, WG_KB output channels per
//     register block (WG_NV vectors of VL), WG_RT tiles per register block, WG_FUSE,
//     WG_SHARE, WG_PARTS parts of a block in the shared input transform;
//   the strides between transform points of V, M and U (padded by a cache line): WG_VP,
//     WG_MP, WG_UP, and WG_WIDE = max(WG_CB, WG_KB);
//   WG_FLIP: the filter is the forward layer's, read flipped with its channels swapped.
// See the module's docstring for the algorithm; every loop bound below is a constant.

// the register-blocked GEMM of a transform point: RR tiles x WG_KB output channels
template <int RR>
static inline __attribute__((always_inline)) void wg_micro(
        const float* __restrict b, const float* __restrict v, float* __restrict m, int n,
        bool add) {
    wg_gemm<RR, WG_NV, WG_CB, 1, WG_KB, WG_KB>(b, v, m, n, add);
}

// U chunk [p][CB][KB] of output channels k0.. and input channels c0.. (g: 27 x CB x KB)
static void wg_filter(const float* __restrict w, float* __restrict u, long k0, long c0,
                      float* g, float* tmp) {
    if (WG_FLIP) {  // w[c][taps][k] of the forward layer; its tap 26 - t is the transposed's t
        for (int c = 0; c < WG_CB; ++c)
            for (int t = 0; t < 27; ++t)
                std::memcpy(g + (long)t * WG_UP + (long)c * WG_KB,
                            w + ((c0 + c) * 27 + 26 - t) * WG_K + k0, sizeof(float) * WG_KB);
    } else if (WG_CB % VL == 0 && VL > 1) {  // w[k][taps][c]: transposed in VL x VL blocks
        for (int j0 = 0; j0 < WG_KB; j0 += VL)
            for (int t = 0; t < 27; ++t)
                for (int c = 0; c < WG_CB; c += VL) {
                    wg_v r[VL];
                    #pragma GCC unroll 16
                    for (int j = 0; j < VL; ++j)
                        r[j] = *(const wg_vu*)(w + ((k0 + j0 + j) * 27 + t) * WG_C + c0 + c);
                    wg_transpose(r);
                    #pragma GCC unroll 16
                    for (int j = 0; j < VL; ++j)
                        *(wg_vu*)(g + (long)t * WG_UP + (long)(c + j) * WG_KB + j0) = r[j];
                }
    } else {  // a channel chunk narrower than a vector: element by element
        for (int j = 0; j < WG_KB; ++j)
            for (int t = 0; t < 27; ++t)
                for (int c = 0; c < WG_CB; ++c)
                    g[(long)t * WG_UP + (long)c * WG_KB + j] = w[((k0 + j) * 27 + t) * WG_C + c0 + c];
    }
    for (int c = 0; c < WG_CB; ++c)
        wg_3d<WG_N, WG_R, WG_KB>(WG_G, g + (long)c * WG_KB, 9 * WG_UP, 3 * WG_UP, WG_UP,
                                 u + (long)c * WG_KB, WG_N * WG_N * WG_UP, WG_N * WG_UP, WG_UP,
                                 tmp);
}

// the tile's first output pixel (batch nb, depth d0, height h0, width w0) of tile i
static inline void wg_tile(long i, long& nb, long& d0, long& h0, long& w0) {
    w0 = WG_M * (i % WG_TW);
    h0 = WG_M * (i / WG_TW % WG_TH);
    d0 = WG_M * (i / (WG_TW * WG_TH) % WG_TD);
    nb = i / (WG_TW * WG_TH * WG_TD);
}

// V[p][t][CB] of the block's tiles from input channels c0.. (x: NDHWC, unpadded)
static void wg_input(const float* __restrict x, float* __restrict V, long tile0, long c0,
                     float* patch, float* tmp, int t0 = 0, int t1 = WG_T) {
    constexpr int n = WG_N;
    for (int t = t0; t < t1; ++t) {
        const long i = tile0 + t;
        float* Vt = V + (long)t * WG_CB;
        if (i >= WG_COUNT) {
            for (int p = 0; p < WG_P; ++p)
                std::memset(Vt + (long)p * WG_VP, 0, sizeof(float) * WG_CB);
            continue;
        }
        long nb, d0, h0, w0;
        wg_tile(i, nb, d0, h0, w0);
        d0 -= WG_PD; h0 -= WG_PH; w0 -= WG_PW;
        if (d0 >= 0 && h0 >= 0 && w0 >= 0 && d0 + n <= WG_D && h0 + n <= WG_H
                && w0 + n <= WG_W) {  // inside: read in place
            wg_3d<n, n, WG_CB>(WG_BT, x + (((nb * WG_D + d0) * WG_H + h0) * WG_W + w0) * WG_C + c0,
                               WG_H * WG_W * WG_C, WG_W * WG_C, WG_C,
                               Vt, n * n * WG_VP, n * WG_VP, WG_VP, tmp);
            continue;
        }
        for (int a = 0; a < n; ++a)  // on the border: padding and cut-short tiles read zeros
        for (int bb = 0; bb < n; ++bb)
        for (int e = 0; e < n; ++e) {
            float* to = patch + ((a * n + bb) * n + e) * WG_CB;
            const long d = d0 + a, h = h0 + bb, ww = w0 + e;
            if (d >= 0 && h >= 0 && ww >= 0 && d < WG_D && h < WG_H && ww < WG_W)
                std::memcpy(to, x + (((nb * WG_D + d) * WG_H + h) * WG_W + ww) * WG_C + c0,
                            sizeof(float) * WG_CB);
            else
                std::memset(to, 0, sizeof(float) * WG_CB);
        }
        wg_3d<n, n, WG_CB>(WG_BT, patch, n * n * WG_CB, n * WG_CB, WG_CB,
                           Vt, n * n * WG_VP, n * WG_VP, WG_VP, tmp);
    }
}

// the transformed filter of the whole layer, chunk (kb, cb) of (K / KB) x (C / CB)
static void wg_filter_chunk(const float* w, float* U, long kb, long cb) {
    static thread_local std::vector<float> scratch;
    const long need = 27 * WG_UP + WG_P * WG_KB;
    if ((long)scratch.size() < need) scratch.resize(need);
    float* g = scratch.data();
    wg_filter(w, U + (kb * (WG_C / WG_CB) + cb) * (WG_P * WG_UP), kb * WG_KB, cb * WG_CB, g,
              g + 27 * WG_UP);
}

// SHARE: the transformed input of block tb, chunk cb, for every work item of the block
// (its tiles in WG_PARTS parts, so that every thread has some where there is one block)
static void wg_input_chunk(const float* x, float* Vs, long tb, long cb, long part) {
    static thread_local std::vector<float> scratch;
    if ((long)scratch.size() < 2 * WG_P * WG_CB) scratch.resize(2 * WG_P * WG_CB);
    wg_input(x, Vs + (tb * (WG_C / WG_CB) + cb) * (WG_P * WG_VP), tb * WG_T, cb * WG_CB,
             scratch.data(), scratch.data() + WG_P * WG_CB,
             part * WG_T / WG_PARTS, (part + 1) * WG_T / WG_PARTS);
}

// one work item: tiles [tb T, tb T + T) x output channels [kg KG, kg KG + KG)
static void wg_item(const float* x, const float* w, const float* U, const float* Vs, float* y,
                    long tb, long kg) {
    constexpr int m = WG_M, n = WG_N, RT = WG_RT, REM = WG_T % WG_RT;
    constexpr long KQ = WG_KG / WG_KB;  // register blocks of output channels per item
    static thread_local std::vector<float> scratch;
    const long need = (WG_SHARE ? 0 : WG_P * WG_VP) + KQ * WG_P * WG_MP + 2 * WG_P * WG_WIDE
                      + (WG_FUSE ? 27 * WG_UP + WG_P * WG_UP : 0);
    if ((long)scratch.size() < need) scratch.resize(need);
    float* Vbuf = scratch.data();                           // [P][T][CB] (SHARE: none)
    const float* V = Vbuf;
    float* M = scratch.data() + (WG_SHARE ? 0 : WG_P * WG_VP);  // [KG / KB][P][T][KB] (+ pad)
    float* patch = M + KQ * WG_P * WG_MP;                   // [P][max(CB, KB)] each
    float* tmp = patch + WG_P * WG_WIDE;
    float* g = tmp + WG_P * WG_WIDE;                        // FUSE: [CB][27][KB] and [P][CB][KB]
    float* uc = g + (WG_FUSE ? 27 * WG_UP : 0);
    (void)g; (void)uc; (void)U; (void)w; (void)Vs; (void)x;
    const long tile0 = tb * WG_T;
    for (int cb = 0; cb < WG_C / WG_CB; ++cb) {
        if (WG_SHARE)
            V = Vs + (tb * (WG_C / WG_CB) + cb) * (WG_P * WG_VP);
        else
            wg_input(x, Vbuf, tile0, cb * WG_CB, patch, tmp);
        const bool add = cb > 0;
        for (int kq = 0; kq < KQ; ++kq) {
            const long kb = kg * KQ + kq;
            const float* u;
            if (WG_FUSE) {
                wg_filter(w, uc, kb * WG_KB, cb * WG_CB, g, tmp);
                u = uc;
            } else {
                u = U + (kb * (WG_C / WG_CB) + cb) * (WG_P * WG_UP);
            }
            for (int p = 0; p < WG_P; ++p) {
                const float* Vp = V + (long)p * WG_VP;
                const float* up = u + (long)p * WG_UP;
                float* Mp = M + ((long)kq * WG_P + p) * WG_MP;
                for (int t = 0; t + RT <= WG_T; t += RT)
                    wg_micro<RT>(Vp + (long)t * WG_CB, up, Mp + (long)t * WG_KB, WG_CB, add);
                if (REM)  // the block's last tiles
                    wg_micro<(REM ? REM : 1)>(Vp + (long)(WG_T - REM) * WG_CB, up,
                                              Mp + (long)(WG_T - REM) * WG_KB, WG_CB, add);
            }
        }
    }
    for (int kq = 0; kq < KQ; ++kq) {
        const long k0 = kg * WG_KG + kq * WG_KB;
        for (int t = 0; t < WG_T; ++t) {
            const long i = tile0 + t;
            if (i >= WG_COUNT) break;
            long nb, d0, h0, w0;
            wg_tile(i, nb, d0, h0, w0);
            const float* Mt = M + (long)kq * WG_P * WG_MP + (long)t * WG_KB;
            if (d0 + m <= WG_OD && h0 + m <= WG_OH && w0 + m <= WG_OW) {
                wg_3d<m, n, WG_KB>(WG_AT, Mt, n * n * WG_MP, n * WG_MP, WG_MP,
                                   y + (((nb * WG_OD + d0) * WG_OH + h0) * WG_OW + w0) * WG_K + k0,
                                   WG_OH * WG_OW * WG_K, WG_OW * WG_K, WG_K, tmp);
                continue;
            }
            // a cut-short tile: only the pixels inside the output
            wg_3d<m, n, WG_KB>(WG_AT, Mt, n * n * WG_MP, n * WG_MP, WG_MP,
                               patch, m * m * WG_KB, m * WG_KB, WG_KB, tmp);
            for (int a = 0; a < m; ++a)
            for (int bb = 0; bb < m; ++bb)
            for (int e = 0; e < m; ++e)
                if (d0 + a < WG_OD && h0 + bb < WG_OH && w0 + e < WG_OW)
                    std::memcpy(y + (((nb * WG_OD + d0 + a) * WG_OH + h0 + bb) * WG_OW + w0 + e) * WG_K + k0,
                                patch + ((a * m + bb) * m + e) * WG_KB, sizeof(float) * WG_KB);
        }
    }
}
