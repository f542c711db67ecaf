// The C++ every Winograd CPU kernel shares (the forward, the data gradient as its
// adjoint, the filter gradient): the transform passes and the register-blocked GEMM step.
// Included by content in each kernel's generated code, after the definitions it needs:
// the vector types wg_v and wg_vu of VL floats and `static constexpr int VL` (written by
// the generator's vector_code).
// The 1D transform M (NO x NI, a constant: its zeros and ones fold away) applied to
// vectors of V floats.  A point (i, j, l) of a 3D array lies at base + i si + j sj + l sl.
// sum_j row[j] x[j stride], the row a constant (ones and zeros fold away)
template <int NI>
static inline __attribute__((always_inline)) wg_v wg_row(const float (&row)[NI],
                                                         const wg_v* x, int stride) {
    wg_v o = (wg_v){};
    #pragma GCC unroll 8
    for (int j = 0; j < NI; ++j) {
        const float c = row[j];
        if (c == 1.0f) o += x[j * stride];
        else if (c == -1.0f) o -= x[j * stride];
        else if (c != 0.0f) o += c * x[j * stride];
    }
    return o;
}

template <int NO, int NI, int V>
static inline __attribute__((always_inline)) void wg_line(
        const float (&M)[NO][NI], const float* __restrict in, long sa, long sb, long se,
        float* __restrict out, long oa, long ob, long oe) {
    // along the first axis, for each of the NI x NI lines (b, e)
    for (int b = 0; b < NI; ++b)
    for (int e = 0; e < NI; ++e) {
        const float* src = in + b * sb + e * se;
        float* dst = out + b * ob + e * oe;
        for (int v = 0; v + VL <= V; v += VL) {
            wg_v x[NI];
            #pragma GCC unroll 8
            for (int j = 0; j < NI; ++j) x[j] = *(const wg_vu*)(src + j * sa + v);
            #pragma GCC unroll 8
            for (int i = 0; i < NO; ++i) *(wg_vu*)(dst + i * oa + v) = wg_row<NI>(M[i], x, 1);
        }
        for (int v = V / VL * VL; v < V; ++v)  // fewer channels than a vector
            for (int i = 0; i < NO; ++i) {
                float o = 0.0f;
                for (int j = 0; j < NI; ++j) o += M[i][j] * src[j * sa + v];
                dst[i * oa + v] = o;
            }
    }
}
template <int NO, int NI, int V>
static inline __attribute__((always_inline)) void wg_plane(
        const float (&M)[NO][NI], const float* __restrict in, long sb, long se,
        float* __restrict out, long ob, long oe) {
    // both axes of an NI x NI plane in registers
    for (int v = 0; v + VL <= V; v += VL) {
        wg_v x[NI][NI], t[NO][NI];
        #pragma GCC unroll 8
        for (int b = 0; b < NI; ++b)
            #pragma GCC unroll 8
            for (int e = 0; e < NI; ++e) x[b][e] = *(const wg_vu*)(in + b * sb + e * se + v);
        #pragma GCC unroll 8
        for (int j = 0; j < NO; ++j)
            #pragma GCC unroll 8
            for (int e = 0; e < NI; ++e) t[j][e] = wg_row<NI>(M[j], &x[0][e], NI);
        #pragma GCC unroll 8
        for (int j = 0; j < NO; ++j)
            #pragma GCC unroll 8
            for (int l = 0; l < NO; ++l)
                *(wg_vu*)(out + j * ob + l * oe + v) = wg_row<NI>(M[l], t[j], 1);
    }
    for (int v = V / VL * VL; v < V; ++v) {
        float t[NO][NI];
        for (int j = 0; j < NO; ++j)
            for (int e = 0; e < NI; ++e) {
                float o = 0.0f;
                for (int b = 0; b < NI; ++b) o += M[j][b] * in[b * sb + e * se + v];
                t[j][e] = o;
            }
        for (int j = 0; j < NO; ++j)
            for (int l = 0; l < NO; ++l) {
                float o = 0.0f;
                for (int e = 0; e < NI; ++e) o += M[l][e] * t[j][e];
                out[j * ob + l * oe + v] = o;
            }
    }
}
// the 3D transform: the first axis into tmp ([NO][NI][NI] vectors), then a plane per output
template <int NO, int NI, int V>
static inline void wg_3d(const float (&M)[NO][NI], const float* in, long sa, long sb, long se,
                         float* out, long oa, long ob, long oe, float* tmp) {
    wg_line<NO, NI, V>(M, in, sa, sb, se, tmp, NI * NI * V, NI * V, V);
    for (int i = 0; i < NO; ++i)
        wg_plane<NO, NI, V>(M, tmp + (long)i * NI * NI * V, NI * V, V, out + i * oa, ob, oe);
}

// The register-blocked GEMM step: m[r][NV VL] (+)= sum_{j < n} b[r ROW_B + j STEP_B]
// v[j STEP_V + .] for RR rows, RR x NV accumulator vectors, one broadcast of b per row and
// reduction step, NV vectors of v per step.  add: start from m instead of zeros.  Inlined
// where it is called, so a constant n or add folds there.
template <int RR, int NV, long ROW_B, long STEP_B, long STEP_V, long ROW_M>
static inline __attribute__((always_inline)) void wg_gemm(
        const float* __restrict b, const float* __restrict v, float* __restrict m, int n,
        bool add) {
    wg_v acc[RR][NV];
    #pragma GCC unroll 32
    for (int r = 0; r < RR; ++r)
        #pragma GCC unroll 8
        for (int q = 0; q < NV; ++q)
            acc[r][q] = add ? *(const wg_vu*)(m + (long)r * ROW_M + q * VL) : (wg_v){};
    for (int j = 0; j < n; ++j) {
        wg_v w[NV];
        #pragma GCC unroll 8
        for (int q = 0; q < NV; ++q) w[q] = *(const wg_vu*)(v + (long)j * STEP_V + q * VL);
        #pragma GCC unroll 32
        for (int r = 0; r < RR; ++r) {
            const wg_v s = (wg_v){} + b[(long)r * ROW_B + (long)j * STEP_B];
            #pragma GCC unroll 8
            for (int q = 0; q < NV; ++q) acc[r][q] += s * w[q];
        }
    }
    #pragma GCC unroll 32
    for (int r = 0; r < RR; ++r)
        #pragma GCC unroll 8
        for (int q = 0; q < NV; ++q) *(wg_vu*)(m + (long)r * ROW_M + q * VL) = acc[r][q];
}
