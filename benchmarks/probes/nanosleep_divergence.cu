// Probe (session 17, benchmarks/NOTES.md): does a plain nanosleep executed by lane 0 alone, while
// the other 31 lanes of its warp wait at the reconvergence point, always wake up? The zero-ahead
// backward hung when its dQ writer polled a counter that way and ran clean with the whole warp
// polling. Each case runs one launch of 264 CTAs x 256 threads and reports ok / HANG (no
// completion within 5 s; the process then exits without tearing the context down).
// Build and run (H200):
//   nvcc -arch=sm_90a -O3 -o /tmp/nsd benchmarks/probes/nanosleep_divergence.cu && /tmp/nsd
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

// mode 0: lane 0 sleeps `rounds` x 1 us, the other lanes go straight to the reconvergence point;
// mode 1: every lane sleeps; mode 2: lane 0 polls a global flag that lane 0 of warp 1 sets after
// its own sleep (the zero-ahead wait's shape).
__global__ void probe(int mode, int rounds, int* flag, int* done) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (mode == 0 && warp == 0) {
    if (lane == 0) for (int i = 0; i < rounds; ++i) __nanosleep(1000);
  } else if (mode == 1 && warp == 0) {
    for (int i = 0; i < rounds; ++i) __nanosleep(1000);
  } else if (mode == 2) {
    if (warp == 1 && lane == 0) {
      for (int i = 0; i < rounds; ++i) __nanosleep(1000);
      atomicExch(flag + blockIdx.x, 1);
    }
    if (warp == 0 && lane == 0)
      while (atomicAdd(flag + blockIdx.x, 0) == 0) __nanosleep(128);
  }
  __syncwarp();
  if (lane == 0) atomicAdd(done, 1);
}

int main() {
  int *flag, *done;
  cudaMalloc(&flag, 4096 * sizeof(int));
  cudaMalloc(&done, sizeof(int));
  const char* names[] = {"lane 0 sleeps alone", "whole warp sleeps", "lane 0 polls a flag"};
  for (int mode = 0; mode < 3; ++mode) {
    for (int rounds : {1, 60, 1000}) {
      cudaMemset(flag, 0, 4096 * sizeof(int));
      cudaMemset(done, 0, sizeof(int));
      probe<<<264, 256>>>(mode, rounds, flag, done);
      auto t0 = std::chrono::steady_clock::now();
      cudaError_t e;
      while ((e = cudaStreamQuery(0)) == cudaErrorNotReady &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (e == cudaErrorNotReady) {
        std::printf("%-22s rounds %5d: HANG\n", names[mode], rounds);
        std::fflush(stdout);
        std::_Exit(1);
      }
      int d = 0;
      cudaMemcpy(&d, done, sizeof(int), cudaMemcpyDeviceToHost);
      std::printf("%-22s rounds %5d: ok (%s, %d warps done)\n", names[mode], rounds,
                  cudaGetErrorString(e), d);
    }
  }
  return 0;
}
