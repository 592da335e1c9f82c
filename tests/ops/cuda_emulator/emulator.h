// A CPU emulation of the CUDA runtime that this project's kernels (src/ops/cuda) use, so that
// their logic runs in ctest on machines without a GPU: grids of blocks of threads, shared
// memory, __syncthreads and warp shuffles, on host memory. The shim headers in include/ stand in
// for the toolkit's (cuda_runtime_api.h, cuda_bf16.h, cuda_fp16.h, cuda_fp8.h); the kernels'
// sources compile unchanged as C++, with FSDP_CUDA_EMULATOR defined (dtype.cuh then launches
// through cuda_emulator::launch).
//
// How it runs: one block at a time; its threads are fibers (ucontext) on the calling thread,
// each running until it reaches a barrier (__syncthreads, or a shuffle for its warp) or ends. A
// barrier opens when every thread it waits for has reached it: __syncthreads for the block's
// threads that have not returned, a shuffle for the 32 lanes of the warp (a warp with an ended
// lane, a shuffle's mask other than 0xffffffff, a warp split between a shuffle and
// __syncthreads, or threads waiting on a barrier that cannot open are reported as errors: on a
// GPU they hang or are undefined). Between barriers the threads run in one of four orders, two
// of them with the blocks last to first (set_order): a kernel whose result depends on the order
// reads what another thread or block writes without a barrier between. The shared memory of each
// block, static and dynamic, starts as 0xff bytes (NaN as floats), so that a read before any
// write shows; the dynamic part ends at a page that faults (guarded_memory.h).
//
// What it cannot show: speed; a race between blocks beyond what their order shows (they run one
// after another, first to last or last to first); a lost update
// (a thread runs from barrier to barrier uninterrupted, so a plain read-modify-write where an
// atomic is needed still adds up); the device's own math functions (expf, log2f: the host's are
// called); which a * b + c the device fuses into one rounding (the host compiler fuses those it
// finds in the kernels, built with -ffp-contract=fast, not necessarily the same ones; on an x86
// processor without FMA the kernel tests skip); memory accessed out of bounds, except past the
// end of a buffer from guarded_alloc (guarded_memory.h), which stops the program: host memory
// traps nothing else. A launch the device would refuse (more than 1024 threads in a block, more
// than 48 KB of dynamic shared memory (the static part is not counted), a grid's y or z above
// 65535) is refused with cudaErrorInvalidConfiguration, as cudaGetLastError reports it. A thread's
// stack is 64 KB with a guard page below it.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
};

// The launch error, cleared by reading it (as the runtime's).
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream);

// The running thread's coordinates (set for each fiber before it runs).
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time: a function's static array is its block's shared memory. They all lie
// in one section of the program, which run() fills with 0xff bytes before each block, as it does
// the dynamic part: a read before any write shows (a NaN as floats). GCC ignores the section of
// a static array in a function template, which then starts zeroed and keeps its values: keep
// __shared__ arrays out of templates (src/ops/cuda's kernels do; a test checks they are all in
// the section).
#define __shared__ static __attribute__((section("fsdp_emulated_shared")))

namespace cuda_emulator {

// Runs `kernel` for every thread of every block of the launch (one block at a time). Throws
// std::runtime_error naming a barrier that cannot open (see above).
void run(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel);

// The order the block's threads run in between two __syncthreads:
// - in_index_order: each thread in turn up to its next barrier, the first to the last;
// - reversed: the same from the last to the first;
// - warp_by_warp: each warp up to its next __syncthreads (through its shuffles) before the
//   next warp starts: a warp runs ahead of the others as far as the barriers let it;
// - warps_reversed: the same from the last warp to the first.
// The two reversed orders also run the grid's blocks from the last to the first (the others from
// the first): a kernel in which a block reads what another block writes, which no order between
// blocks guarantees on a GPU, then differs too.
enum class Order { in_index_order, reversed, warp_by_warp, warps_reversed };
void set_order(Order order);

// Two of the kernels' size thresholds, lowered by a test so that paths a GPU takes only at large
// sizes run at the test's small ones (dtype.cuh asks for them through strided_blocks and
// narrow_index_limit):
// - grid_blocks: the most blocks a launch gives a grid dimension that its kernel covers with a
//   grid-stride loop. At 2, a block takes several rows (or tiles), and the barriers that guard a
//   shared buffer's reuse from one row to the next run.
// - narrow_index: the offsets below which a kernel may index with 32-bit arithmetic (4G on the
//   device). At 0, every kernel with a 64-bit path takes it.
struct Limits {
  int64_t grid_blocks = INT64_MAX;
  int64_t narrow_index = UINT32_MAX;
};
Limits set_limits(Limits limits);  // returns those it replaces; Limits{} are the device's

// set_limits for a scope, the previous ones restored at its end.
class ScopedLimits {
 public:
  explicit ScopedLimits(Limits limits) : previous_(set_limits(limits)) {}
  ~ScopedLimits() { set_limits(previous_); }
  ScopedLimits(const ScopedLimits&) = delete;
  ScopedLimits& operator=(const ScopedLimits&) = delete;

 private:
  Limits previous_;
};

// min(wanted, limit, the set grid_blocks); the set narrow_index.
int64_t strided_blocks(int64_t wanted, int64_t limit);
// How many strided_blocks calls so far the set grid_blocks cut (below min(wanted, limit)): a test
// that lowers it can check that it reached the kernels.
int64_t grids_cut();
int64_t narrow_index_limit();

// The running block's dynamic shared memory.
void* dynamic_shared_memory();

// The fiber's side of a barrier: __syncthreads, and a shuffle's exchange of 8 bytes.
void block_barrier();
uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask);

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t,
            Args... args) {
  run(grid, block, shared, [&] { kernel(args...); });
}

template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

}  // namespace cuda_emulator

inline void __syncthreads() { cuda_emulator::block_barrier(); }

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes here");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = cuda_emulator::shuffle_xor(mask, bits, lane_mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// One thread runs at a time: atomics are plain read-modify-writes.
inline unsigned atomicMax(unsigned* address, unsigned v) {
  const unsigned old = *address;
  if (v > old) *address = v;
  return old;
}
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// The device's correctly rounded operations, which nvcc never fuses into an fma: the host's IEEE
// ones, out of line (emulator.cpp), so that the host compiler, which fuses the kernels' other
// a * b + c as nvcc does, cannot fuse these either.
float __fmul_rn(float a, float b);
float __fadd_rn(float a, float b);
double __dmul_rn(double a, double b);
inline float __double2float_rn(double v) { return static_cast<float>(v); }
inline float __expf(float v) { return expf(v); }
inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float v) {
  unsigned u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
