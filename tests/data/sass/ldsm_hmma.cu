// A loop of ldmatrix (LDSM) feeding mma.sync m16n8k16 (HMMA), as a tensor-core main loop.
#include <cuda_fp16.h>
__global__ void ldsm_hmma(const half* __restrict__ in, float* out, int n) {
  __shared__ __align__(16) half tile[64 * 64];
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) tile[i] = in[i];
  __syncthreads();
  float c[4] = {0, 0, 0, 0};
  unsigned lane = threadIdx.x & 31;
  for (int k = 0; k < n; ++k) {
    unsigned a0, a1, a2, a3, b0, b1;
    unsigned pa = (unsigned)__cvta_generic_to_shared(&tile[((lane + k) & 15) * 64 + (lane >> 4) * 8]);
    unsigned pb = (unsigned)__cvta_generic_to_shared(&tile[2048 + ((lane + k) & 15) * 64]);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(pa));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(b0), "=r"(b1) : "r"(pb));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  out[threadIdx.x] = c[0] + c[1] + c[2] + c[3];
}
