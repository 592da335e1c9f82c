#include "comm/nccl/nccl_work.h"

#include <fmt/format.h>

namespace fsdp::detail {
namespace {

// How long a stream stalled at a wait: the time between an event recorded just before
// cudaStreamWaitEvent and one just after. The first completes when the stream has done its
// earlier work, the second when the collective is done too, so the difference is the stall
// (zero when the collective finished first). A stream the host left idle before the wait
// counts its idle time as stall too: the device had nothing else to do meanwhile.
class StreamStall final : public WaitClock::Pending {
 public:
  // Creates both (timing) events; throws CommError for `op` when CUDA cannot.
  StreamStall(int device, const char* op, int rank, int world) : device_(device) {
    FSDP_CUDA_CHECK(cudaEventCreate(&before_), op, rank, world);
    if (cudaError_t rc = cudaEventCreate(&after_); rc != cudaSuccess) {
      cudaEventDestroy(before_);
      FSDP_CUDA_CHECK(rc, op, rank, world);
    }
  }
  ~StreamStall() override {
    cudaEventDestroy(before_);
    cudaEventDestroy(after_);
  }
  StreamStall(const StreamStall&) = delete;
  StreamStall& operator=(const StreamStall&) = delete;
  cudaEvent_t before() const { return before_; }
  cudaEvent_t after() const { return after_; }
  bool ready() override { return cudaEventQuery(after_) != cudaErrorNotReady; }
  double seconds() override {
    CudaDeviceGuard guard(device_);
    float ms = 0;
    if (cudaEventSynchronize(after_) != cudaSuccess ||
        cudaEventElapsedTime(&ms, before_, after_) != cudaSuccess) {
      cudaGetLastError();  // a failed measurement counts nothing (wait_clock.h)
      return 0;
    }
    return ms / 1e3;
  }

 private:
  int device_;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
};

}  // namespace

EventState query_event(cudaEvent_t event) {
  const cudaError_t rc = cudaEventQuery(event);
  if (rc == cudaSuccess) return {EventState::kDone, ""};
  if (rc == cudaErrorNotReady) return {EventState::kRunning, ""};
  return {EventState::kFailed, cudaGetErrorString(rc)};
}

NcclWork::NcclWork(std::shared_ptr<NcclComm> comm, cudaEvent_t done, cudaStream_t issued_on,
                   std::vector<at::Tensor> stash, bool host_blocking, const char* op)
    : comm_(std::move(comm)),
      done_(done),
      issued_on_(issued_on),
      stash_(std::move(stash)),
      host_blocking_(host_blocking),
      op_(op) {}

NcclWork::~NcclWork() { cudaEventDestroy(done_); }

void NcclWork::wait_impl(WaitClock* clock) {
  const int rank = comm_->rank(), world = comm_->world();
  CudaDeviceGuard guard(comm_->device());
  comm_->check(op_);
  const EventState state = query();
  if (state.kind == EventState::kFailed) {
    throw CommError("nccl", op_, rank, world,
                    fmt::format("the GPU reported an error while it ran: {}", state.error));
  }
  if (host_blocking_) {
    const auto start = std::chrono::steady_clock::now();
    FSDP_CUDA_CHECK(cudaEventSynchronize(done_), op_, rank, world);
    comm_->check(op_);  // the watchdog's abort is what ends a stuck wait
    if (clock) {
      clock->add(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    stash_.clear();
    return;
  }
  cudaStream_t stream = current_cuda_stream(comm_->device());
  std::unique_ptr<StreamStall> stall;
  if (clock) {
    stall = std::make_unique<StreamStall>(comm_->device(), op_, rank, world);
    FSDP_CUDA_CHECK(cudaEventRecord(stall->before(), stream), op_, rank, world);
  }
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0), op_, rank, world);
  if (clock) {
    FSDP_CUDA_CHECK(cudaEventRecord(stall->after(), stream), op_, rank, world);
    clock->add(std::move(stall));
  }
  if (stream == issued_on_) stash_.clear();
}

}  // namespace fsdp::detail
