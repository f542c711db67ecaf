// Two loops in one kernel: a short scaling loop, then the loop with the most FFMA.
__global__ void two_loops(const float* __restrict__ in, float* out, float a, int n, int m) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += in[i * blockDim.x + threadIdx.x];
  float x = s, y = s + 1.0f, z = s + 2.0f, w = s + 3.0f;
  for (int j = 0; j < m; ++j) {
    x = fmaf(x, a, y); y = fmaf(y, a, z); z = fmaf(z, a, w); w = fmaf(w, a, x);
    x = fmaf(x, a, 1.0f); y = fmaf(y, a, 2.0f); z = fmaf(z, a, 3.0f); w = fmaf(w, a, 4.0f);
  }
  out[threadIdx.x] = x + y + z + w;
}
