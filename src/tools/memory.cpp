#include "fsdp/tools/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/resource.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#ifdef FSDP_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace fsdp {
namespace {

// Counts live bytes. Data pointer and context are the same pointer, as in c10's default CPU
// allocator, so raw_allocate and raw_deleter keep working.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = c10::alloc_cpu(nbytes);
    if (p != nullptr) instance().add(p, nbytes);
    return {p, p, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static CountingCpuAllocator& instance() {
    static auto* a = new CountingCpuAllocator();  // outlives every tensor: never destroyed
    return *a;
  }
  HostTensorMemory read() const { return {true, allocated_.load(), peak_.load()}; }
  void reset_peak() { peak_.store(allocated_.load()); }

 private:
  static void release(void* p) {
    if (p != nullptr) instance().remove(p);
    c10::free_cpu(p);
  }
  void add(void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = n;
    const int64_t now = allocated_ += static_cast<int64_t>(n);
    if (now > peak_) peak_ = now;
  }
  void remove(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    allocated_ -= static_cast<int64_t>(it->second);
    sizes_.erase(it);
  }

  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  std::atomic<int64_t> allocated_{0}, peak_{0};
};

std::atomic<bool> g_tracking{false};

}  // namespace

void track_host_tensor_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Priority above the default's (0), so that nothing registered later at 0 replaces it.
    c10::SetCPUAllocator(&CountingCpuAllocator::instance(), /*priority=*/1);
    g_tracking = true;
  });
}

HostTensorMemory host_tensor_memory() {
  if (!g_tracking) return {};
  return CountingCpuAllocator::instance().read();
}

void reset_host_tensor_peak() {
  if (g_tracking) CountingCpuAllocator::instance().reset_peak();
}

int64_t host_peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

#ifdef FSDP_HAVE_TORCH_CUDA
int64_t cuda_peak_allocated_bytes(int device) {
  auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

void cuda_reset_peak_allocated_bytes(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}
#else
int64_t cuda_peak_allocated_bytes(int) { return -1; }
void cuda_reset_peak_allocated_bytes(int) {}
#endif

}  // namespace fsdp
