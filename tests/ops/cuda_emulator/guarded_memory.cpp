// guarded_memory.h: mmap'ed pages with a PROT_NONE page after them, the buffers' guard pages
// recorded for the SIGSEGV handler (installed with the first buffer, on an alternate stack: it
// may also meet a fiber's overflowed stack).
#include "guarded_memory.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace cuda_emulator {
namespace {

// The live buffers' guard pages (start addresses, 0 for a free slot) and their sizes, read by
// the signal handler without locks.
constexpr int kSlots = 4096;
std::array<std::atomic<uintptr_t>, kSlots> guards{};
std::array<std::atomic<size_t>, kSlots> sizes{};

const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));

void on_fault(int, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kSlots; ++i) {
    const uintptr_t g = guards[i].load();
    if (g != 0 && at >= g && at < g + page) {
      char message[256];
      const int n = snprintf(message, sizeof message,
                             "cuda emulator: a kernel accessed byte %zu past the end of a buffer "
                             "of %zu bytes (on a GPU: out of bounds)\n",
                             static_cast<size_t>(at - g), sizes[i].load());
      if (n > 0) (void)!write(STDERR_FILENO, message, static_cast<size_t>(n));
      abort();
    }
  }
  // Not a guard page (a fiber's stack overflow, a plain crash): the default action, once the
  // handler returns (SIGSEGV is blocked until then) and the access faults again.
  signal(SIGSEGV, SIG_DFL);
  raise(SIGSEGV);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    static std::array<char, 64 * 1024> alternate;
    stack_t ss{};
    ss.ss_sp = alternate.data();
    ss.ss_size = alternate.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
  });
}

}  // namespace

std::shared_ptr<void> guarded_alloc(size_t bytes) {
  install_handler();
  const size_t data_pages = (bytes + page - 1) / page;
  const size_t total = (data_pages + 1) * page;
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("cuda emulator: no memory for a guarded buffer");
  char* guard = static_cast<char*>(p) + data_pages * page;
  if (mprotect(guard, page, PROT_NONE) != 0) {
    munmap(p, total);
    throw std::runtime_error("cuda emulator: cannot protect a guarded buffer's guard page");
  }
  // Not the zeros of a fresh mapping: an output a kernel leaves unwritten must not pass for one
  // it wrote zeros to (NaN as floats, as the emulator's shared memory).
  std::memset(guard - bytes, 0xff, bytes);
  // A free slot (0): compare_exchange writes what it found into `free`, hence its reset.
  int slot = 0;
  for (uintptr_t free = 0; slot < kSlots; ++slot, free = 0) {
    if (guards[slot].compare_exchange_strong(free, reinterpret_cast<uintptr_t>(guard))) break;
  }
  if (slot == kSlots) {
    munmap(p, total);
    throw std::runtime_error("cuda emulator: more than 4096 guarded buffers alive");
  }
  sizes[slot].store(bytes);
  return std::shared_ptr<void>(guard - bytes, [p, total, slot](void*) {
    guards[slot].store(0);
    munmap(p, total);
  });
}

}  // namespace cuda_emulator
