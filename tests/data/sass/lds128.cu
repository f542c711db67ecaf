// A loop that reads float4 (LDS.128) from shared memory and multiplies-adds them.
__global__ void lds128(const float4* __restrict__ in, float* out, int n) {
  __shared__ float4 tile[256];
  float acc[4] = {0, 0, 0, 0};
  tile[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
  __syncthreads();
  for (int k = 0; k < n; ++k) {
    float4 a = tile[(threadIdx.x + k) & 255];
    float4 b = tile[(threadIdx.x + 3 * k) & 255];
    acc[0] = fmaf(a.x, b.x, acc[0]); acc[1] = fmaf(a.y, b.y, acc[1]);
    acc[2] = fmaf(a.z, b.z, acc[2]); acc[3] = fmaf(a.w, b.w, acc[3]);
  }
  out[blockIdx.x * 256 + threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
}
