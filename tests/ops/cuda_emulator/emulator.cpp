// The fibers behind emulator.h: a block's threads as fibers on the calling thread, a scheduler
// that runs each until it waits at a barrier or ends, and opens the barriers.
//
// A fiber is made once per launch (makecontext on its own stack) and runs the kernel once per
// block in a loop; every later switch is _setjmp/_longjmp, which unlike swapcontext saves no
// signal mask: no system call per switch (swapcontext's made the test 10x slower). glibc's
// fortified longjmp refuses a jump to another stack, hence no _FORTIFY_SOURCE here.
#undef _FORTIFY_SOURCE
#include "emulator.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "guarded_memory.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

// The bounds of the section that __shared__ puts the kernels' static shared arrays in, from the
// linker (weak: a program without any has no such section).
extern "C" char __start_fsdp_emulated_shared[] __attribute__((weak));
extern "C" char __stop_fsdp_emulated_shared[] __attribute__((weak));

namespace {

cudaError_t last_error = cudaSuccess;
cuda_emulator::Order order = cuda_emulator::Order::in_index_order;
cuda_emulator::Limits limits;
int64_t cut = 0;  // grids_cut()

enum class State { ready, at_syncthreads, at_shuffle, ended };

struct Fiber {
  ucontext_t context;  // its start
  jmp_buf resume;      // where it waits, once started
  bool started = false;
  std::shared_ptr<char> stack;  // mmap'ed, a guard page at its low end
  State state = State::ready;
  dim3 index;
  unsigned mask = 0;
  int lane_mask = 0;
  uint64_t sent = 0, received = 0;
};

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kWarp = 32;

// The launch being run (one at a time: the kernels' launchers are called from one thread).
struct Launch {
  const std::function<void()>* kernel = nullptr;
  std::vector<Fiber> fibers;
  jmp_buf scheduler;
  int current = -1;
  std::shared_ptr<void> shared;  // guarded_alloc's: an access past its end stops the program
  size_t shared_bytes = 0;
};
Launch* active = nullptr;

Fiber& current_fiber() {
  if (active == nullptr || active->current < 0) {
    throw std::logic_error("cuda emulator: a barrier outside a kernel");
  }
  return active->fibers[active->current];
}

// Back to the scheduler, in `state`.
void wait(State state) {
  Fiber& f = current_fiber();
  f.state = state;
  if (_setjmp(f.resume) == 0) _longjmp(active->scheduler, 1);
}

// The scheduler's side: runs fiber `i` until it waits or ends. Not inlined: _setjmp's return
// through _longjmp may clobber the caller's registers, and its callers keep loop counters there.
__attribute__((noinline)) void switch_to(Launch& launch, int i) {
  Fiber& f = launch.fibers[i];
  threadIdx = f.index;
  launch.current = i;
  if (_setjmp(launch.scheduler) == 0) {
    if (f.started) _longjmp(f.resume, 1);
    f.started = true;
    ucontext_t unused;  // the fiber comes back by _longjmp, never to here
    swapcontext(&unused, &f.context);
  }
  launch.current = -1;
}

// A fiber: the kernel once per block, ended in between (the scheduler readies it for the next).
void fiber_main() {
  while (true) {
    (*active->kernel)();
    wait(State::ended);
  }
}

std::string where(const std::string& what) {
  return std::string("cuda emulator: block (") + std::to_string(blockIdx.x) + ", " +
         std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) + "): " + what;
}

// Opens the warps of fibers [begin, end) whose 32 lanes all wait at a shuffle: each gets its
// partner's value. Returns whether one opened; throws on a warp that can never open.
bool open_warps(std::vector<Fiber>& fibers, size_t begin, size_t end) {
  bool opened = false;
  for (size_t first = begin; first < end; first += kWarp) {
    int at_shuffle = 0, ended = 0;
    for (size_t i = first; i < first + kWarp && i < fibers.size(); ++i) {
      at_shuffle += fibers[i].state == State::at_shuffle;
      ended += fibers[i].state == State::ended;
    }
    if (at_shuffle == 0) continue;
    if (first + kWarp > fibers.size()) {
      throw std::runtime_error(where("a shuffle in a warp of fewer than 32 threads"));
    }
    if (ended > 0) throw std::runtime_error(where("a shuffle in a warp with ended lanes"));
    if (at_shuffle < kWarp) continue;  // the others have not got there yet, or wait elsewhere
    for (size_t i = first; i < first + kWarp; ++i) {
      const Fiber& f = fibers[i];
      if (f.mask != 0xffffffffu || f.lane_mask != fibers[first].lane_mask || f.lane_mask < 0 ||
          f.lane_mask >= kWarp) {
        throw std::runtime_error(where("a shuffle whose lanes give other masks or offsets"));
      }
    }
    for (size_t i = first; i < first + kWarp; ++i) {
      const size_t partner = first + ((i - first) ^ static_cast<size_t>(fibers[i].lane_mask));
      fibers[i].received = fibers[partner].sent;
    }
    for (size_t i = first; i < first + kWarp; ++i) fibers[i].state = State::ready;
    opened = true;
  }
  return opened;
}

// Not inlined: getcontext returns twice, as _setjmp does (see switch_to).
__attribute__((noinline)) void make_fiber(Fiber& f, dim3 index) {
  f.index = index;
  // The stack grows down: an overflow hits the PROT_NONE page and faults instead of writing
  // over the heap.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p =
      mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0) {
    throw std::runtime_error("cuda emulator: no memory for a thread's stack");
  }
  f.stack = std::shared_ptr<char>(static_cast<char*>(p),
                                  [size = kStackBytes + page](char* q) { munmap(q, size); });
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.get() + page;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;  // fiber_main never returns
  makecontext(&f.context, fiber_main, 0);
}

// Runs the ready fibers of [begin, end), in order or reversed, and the shuffles of their warps,
// until every one of them waits at __syncthreads or has ended.
void run_until_waiting(Launch& launch, int begin, int end, bool reversed) {
  do {
    for (int k = begin; k < end; ++k) {
      const int i = reversed ? end - 1 - (k - begin) : k;
      if (launch.fibers[i].state == State::ready) switch_to(launch, i);
    }
  } while (open_warps(launch.fibers, begin, end));
}

void run_block(Launch& launch) {
  auto& fibers = launch.fibers;
  for (auto& f : fibers) f.state = State::ready;
  std::memset(launch.shared.get(), 0xff, launch.shared_bytes);
  if (__start_fsdp_emulated_shared != nullptr) {
    std::memset(__start_fsdp_emulated_shared, 0xff,
                __stop_fsdp_emulated_shared - __start_fsdp_emulated_shared);
  }
  const int n = static_cast<int>(fibers.size());
  while (true) {
    using cuda_emulator::Order;
    if (order == Order::warp_by_warp || order == Order::warps_reversed) {
      const int warps = (n + kWarp - 1) / kWarp;
      for (int k = 0; k < warps; ++k) {
        const int w = (order == Order::warps_reversed ? warps - 1 - k : k) * kWarp;
        run_until_waiting(launch, w, std::min(n, w + kWarp), false);
      }
    } else {
      run_until_waiting(launch, 0, n, order == Order::reversed);
    }
    int ended = 0, at_syncthreads = 0;
    for (const auto& f : fibers) {
      ended += f.state == State::ended;
      at_syncthreads += f.state == State::at_syncthreads;
    }
    if (ended == n) return;
    if (at_syncthreads + ended == n) {  // threads that returned do not hold the barrier
      for (auto& f : fibers) {
        if (f.state == State::at_syncthreads) f.state = State::ready;
      }
      continue;
    }
    throw std::runtime_error(
        where(std::to_string(at_syncthreads) + " threads wait at __syncthreads, " +
              std::to_string(n - ended - at_syncthreads) + " at a shuffle whose warp cannot meet"));
  }
}

}  // namespace

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
  }
  return "unknown error";
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

// Out of line: see emulator.h. This file is built without contraction.
float __fmul_rn(float a, float b) { return a * b; }
float __fadd_rn(float a, float b) { return a + b; }
double __dmul_rn(double a, double b) { return a * b; }

namespace cuda_emulator {

void set_order(Order o) { order = o; }

Limits set_limits(Limits l) {
  std::swap(limits, l);
  return l;
}
int64_t strided_blocks(int64_t wanted, int64_t limit) {
  if (limits.grid_blocks < std::min(wanted, limit)) ++cut;
  return std::min({wanted, limit, limits.grid_blocks});
}
int64_t grids_cut() { return cut; }
int64_t narrow_index_limit() { return limits.narrow_index; }

void* dynamic_shared_memory() {
  if (active == nullptr) throw std::logic_error("cuda emulator: shared memory outside a kernel");
  return active->shared.get();
}

void block_barrier() { wait(State::at_syncthreads); }

uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask) {
  Fiber& f = current_fiber();
  f.mask = mask;
  f.lane_mask = lane_mask;
  f.sent = bits;
  wait(State::at_shuffle);
  return current_fiber().received;
}

void run(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || shared_bytes > 48 * 1024) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (active != nullptr) throw std::logic_error("cuda emulator: a launch inside a launch");
  Launch launch;
  launch.kernel = &kernel;
  launch.fibers.resize(threads);
  // Rounded up to 16 bytes, so that it starts on a 16-byte boundary, as a device's shared memory
  // does, and ends where a page that faults begins (an access past it stops the program).
  launch.shared_bytes = (shared_bytes + 15) / 16 * 16;
  launch.shared = guarded_alloc(launch.shared_bytes);
  for (unsigned z = 0, i = 0; z < block.z; ++z) {
    for (unsigned y = 0; y < block.y; ++y) {
      for (unsigned x = 0; x < block.x; ++x, ++i) {
        make_fiber(launch.fibers[i], dim3(x, y, z));
      }
    }
  }
  active = &launch;
  blockDim = block;
  gridDim = grid;
  try {
    using cuda_emulator::Order;
    const bool backwards = order == Order::reversed || order == Order::warps_reversed;
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          blockIdx =
              backwards ? dim3(grid.x - 1 - x, grid.y - 1 - y, grid.z - 1 - z) : dim3(x, y, z);
          run_block(launch);
        }
      }
    }
  } catch (...) {
    active = nullptr;
    throw;
  }
  active = nullptr;
}

}  // namespace cuda_emulator
