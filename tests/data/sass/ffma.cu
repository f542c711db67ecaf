// A loop whose body is FFMA on registers only: no memory access inside the loop.
__global__ void ffma_only(float* out, float a, float b, int n) {
  float x = threadIdx.x, y = blockIdx.x, z = 1.0f, w = 2.0f;
  for (int i = 0; i < n; ++i) {
    x = fmaf(x, a, b); y = fmaf(y, a, b); z = fmaf(z, a, b); w = fmaf(w, a, b);
    x = fmaf(x, b, a); y = fmaf(y, b, a); z = fmaf(z, b, a); w = fmaf(w, b, a);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x + y + z + w;
}
