// The NCCL backend: CUDA tensors, one rank per GPU. Collectives run on the group's own
// communication stream, ordered after the caller's stream by an event; Work::wait() makes the
// caller's stream wait for the collective's event, so the host never blocks inside a step
// (the design of c10d's ProcessGroupNCCL). Its watchdog, too: a thread aborts the communicator
// when a collective has not completed within the timeout, fails on the GPU, or NCCL reports an
// asynchronous error, so a dead or stuck peer becomes a CommError instead of a hang.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/nccl/nccl_comm.h"
#include "comm/nccl/nccl_work.h"
#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"
#include "util/check.h"
#include "util/poll.h"
#include "util/profiler_range.h"

namespace fsdp {
namespace {

using detail::CudaDeviceGuard;
using detail::NcclComm;
using detail::NcclWork;

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    default:
      throw UnsupportedError(fmt::format("backend nccl has no type for {}", c10::toString(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

// FSDP_DEBUG_COMM_DELAY_MS: milliseconds each collective is held back on the communication
// stream (0: off). A stream wait missing anywhere then reads buffers before the collective
// filled them, which shows on one GPU as wrong numbers instead of a rare race.
int debug_delay_ms() {
  const char* v = std::getenv("FSDP_DEBUG_COMM_DELAY_MS");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long ms = std::strtol(v, &end, 10);
  if (*end != '\0' || ms < 0 || ms > 60000) {
    throw InvalidArgument(
        fmt::format("FSDP_DEBUG_COMM_DELAY_MS='{}': expected milliseconds in [0, 60000]", v));
  }
  return static_cast<int>(ms);
}

// The order of NCCL launches on one device, across every communicator of the process (an FSDP
// group and a tensor-parallel one, HSDP's shard and replica groups). NCCL's kernels wait for
// their peers on the GPU, so two communicators whose collectives run concurrently can
// deadlock: rank 0's all-gather waits for rank 1's, which cannot start because rank 1's GPU
// runs a tensor-parallel all-reduce that waits for rank 0 (NCCL's guide, "Using multiple NCCL
// communicators concurrently"). Each launch therefore starts after the previous launch on the
// device, whichever group made it: the GPU runs them in the host's issue order, which is the
// same on every rank of an SPMD program (NCCL_LAUNCH_ORDER_IMPLICIT's rule, made here for any
// NCCL version). Communication still overlaps compute; only collectives of different groups no
// longer overlap each other.
struct DeviceLaunchOrder {
  std::mutex mu;
  cudaEvent_t tail = nullptr;          // recorded after the last launch on the device
  cudaStream_t tail_stream = nullptr;  // the stream it was recorded on
};

DeviceLaunchOrder& launch_order(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceLaunchOrder>> orders;  // never freed: process-wide
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = orders[device];
  if (!slot) slot = std::make_unique<DeviceLaunchOrder>();
  return *slot;
}

// Runs on CUDA's host-callback thread, in stream order: the stream stalls while it sleeps.
void CUDART_CB sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(int rank, int size, std::shared_ptr<NcclComm> comm)
      : ProcessGroup(rank, size),
        device_(comm->device()),
        comm_(std::move(comm)),
        delay_ms_(debug_delay_ms()) {
    CudaDeviceGuard guard(device_);
    // The highest priority, as FSDP2's all-gather and reduce-scatter streams: a collective
    // ready to run goes ahead of queued compute kernels, so that it is done when the compute
    // waits for it.
    int least = 0, greatest = 0;
    FSDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "init", rank, size);
    FSDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "init",
                    rank, size);
    if (comm_->timeout().count() > 0) watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    watchdog_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    CudaDeviceGuard guard(device_);
    const auto drained = [this] { return cudaStreamQuery(stream_) != cudaErrorNotReady; };
    bool idle = false;
    if (std::uncaught_exceptions() > 0 && !comm_->aborted()) {
      // Leaving on an error: a collective of this rank's may wait for peers that will not join
      // it (they wait in another), and waiting out the timeout below would hold the process.
      // Aborted, its kernels return and the process exits; its launcher ends the others. The
      // abort and the drain after it wait at most until the process's leaving deadline.
      const auto deadline = NcclComm::leaving_deadline();
      if (comm_->abort_leaving("the group was destroyed while this rank was leaving on an error",
                               deadline)) {
        idle = detail::wait_until(drained,
                                  std::max(std::chrono::milliseconds(0),
                                           std::chrono::duration_cast<std::chrono::milliseconds>(
                                               deadline - std::chrono::steady_clock::now())));
        if (!idle) {
          std::fprintf(stderr,
                       "[nccl rank %d/%d] fsdp: the stream did not drain after ncclCommAbort "
                       "while this rank was leaving on an error; leaving without it\n",
                       rank(), size());
        }
      }
    } else {
      // The watchdog is gone: a collective stuck on the stream (a dead peer) would hold this
      // destructor forever. Wait at most the timeout, then abort the communicator (its kernels
      // return) and wait once more.
      idle = detail::wait_until(drained, comm_->timeout());
      if (!idle) {
        const std::string cause = fmt::format(
            "the group was destroyed with a collective still running after {} ms (the timeout): "
            "a peer died or stopped; the communicator was aborted",
            comm_->timeout().count());
        std::fprintf(stderr, "[nccl rank %d/%d] fsdp: %s\n", rank(), size(), cause.c_str());
        comm_->abort(cause);
        idle = detail::wait_until(drained, comm_->timeout());
      }
    }
    if (idle) {
      inflight_.clear();
      cudaStreamDestroy(stream_);
    } else {
      // Kernels may still read and write the collectives' tensors: the stream and the tensors
      // are left as they are (leaked) rather than freed under running work.
      new decltype(inflight_)(std::move(inflight_));
    }
    // comm_ goes with the last Work that holds it.
  }

  Backend backend() const override { return Backend::kNccl; }
  at::DeviceType device_type() const override { return at::kCUDA; }
  at::Device device() const override {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

 protected:
  WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    check_device("all_gather", {output, input});
    return launch("all_gather", {output, input}, false, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                           nccl_type(input.scalar_type()), c, s);
    });
  }

  // 16-bit floats are reduced in their own dtype, as c10d and FSDP2 do (a bf16 reduce_dtype
  // moves bf16 bytes; ncclAvg divides in it): NCCL rounds at each step of its ring, which the
  // CPU backends avoid by summing in float32 (process_group.h).
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op) override {
    check_device("reduce_scatter", {output, input});
    return launch("reduce_scatter", {output, input}, false, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                               nccl_type(input.scalar_type()), nccl_op(op), c, s);
    });
  }

  WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    check_device("all_reduce", {tensor});
    return launch("all_reduce", {tensor}, false, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), nccl_op(op), c, s);
    });
  }

  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override {
    check_device("broadcast", {tensor});
    return launch("broadcast", {tensor}, false, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), root, c, s);
    });
  }

  WorkPtr do_barrier() override {
    CudaDeviceGuard guard(device_);
    auto token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
    // A barrier is a host-side promise: its wait() blocks until every rank arrived.
    return launch("barrier", {token}, true, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, c, s);
    });
  }

  std::shared_ptr<ProcessGroup> do_split(int color, const std::vector<int>& members,
                                         int index) override {
    auto child = comm_->split(color, /*key=*/rank(), static_cast<int>(members.size()));
    return std::make_shared<NcclProcessGroup>(index, static_cast<int>(members.size()),
                                              std::move(child));
  }

 private:
  void check_device(const char* op, std::initializer_list<at::Tensor> tensors) const {
    for (const auto& t : tensors) {
      FSDP_CHECK_ARG(t.device().index() == device_,
                     "{}: tensor on {} but this NCCL group drives cuda:{}", op, t.device().str(),
                     device_);
    }
  }

  template <typename Issue>
  WorkPtr launch(const char* op, std::vector<at::Tensor> tensors, bool host_blocking, Issue issue) {
    if (comm_->aborted()) comm_->check(op);  // throws with the abort's cause
    CudaDeviceGuard guard(device_);
    cudaStream_t caller = detail::current_cuda_stream(device_);
    // CUDA graphs: a collective captured into a graph would replay without its event, its
    // watchdog or its tensors' lifetimes, and the watchdog's event queries from another thread
    // invalidate a capture in the global mode: refused, before anything is queued.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    FSDP_CUDA_CHECK(cudaStreamIsCapturing(caller, &capture), op, rank(), size());
    if (capture != cudaStreamCaptureStatusNone) {
      throw UnsupportedError(fmt::format(
          "[nccl rank {}/{}] {}: the current stream is being captured into a CUDA graph; "
          "fsdp's NCCL collectives cannot be captured (run FSDP's forward and backward outside "
          "the capture, and capture only compute in the thread-local mode)",
          rank(), size(), op));
    }
    cudaEvent_t ready = nullptr, done = nullptr;
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), op, rank(), size());
    FSDP_CUDA_CHECK(cudaEventRecord(ready, caller), op, rank(), size());
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0), op, rank(), size());
    cudaEventDestroy(ready);  // safe: destruction is deferred until the event completes
    if (delay_ms_ > 0) {
      FSDP_CUDA_CHECK(cudaLaunchHostFunc(stream_, sleep_on_stream,
                                         reinterpret_cast<void*>(static_cast<intptr_t>(delay_ms_))),
                      op, rank(), size());
    }
    {
      // On the issuing thread: NVTX projects the range onto the kernels it launched, so
      // Nsight shows fsdp::comm::<op> on the NCCL stream.
      int64_t bytes = 0;
      for (const auto& t : tensors) bytes = std::max<int64_t>(bytes, t.nbytes());
      FSDP_RANGE_BYTES(std::string("fsdp::comm::") + op, bytes);
      auto& order = launch_order(device_);
      std::lock_guard<std::mutex> order_lock(order.mu);
      if (order.tail == nullptr) {
        FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&order.tail, cudaEventDisableTiming), op, rank(),
                        size());
      } else if (order.tail_stream != stream_) {
        // The previous launch on this device was another group's (DeviceLaunchOrder).
        FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, order.tail, 0), op, rank(), size());
      }
      // Under the communicator's lock: the watchdog cannot abort it halfway.
      comm_->run(op, [&](ncclComm_t c) { return issue(c, stream_); });
      FSDP_CUDA_CHECK(cudaEventRecord(order.tail, stream_), op, rank(), size());
      order.tail_stream = stream_;
    }
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), op, rank(), size());
    if (cudaError_t rc = cudaEventRecord(done, stream_); rc != cudaSuccess) {
      cudaEventDestroy(done);
      FSDP_CUDA_CHECK(rc, op, rank(), size());
    }
    auto work =
        std::make_shared<NcclWork>(comm_, done, caller, std::move(tensors), host_blocking, op);
    // Until its event completes the group keeps the Work (and, until a wait() on the issuing
    // stream, its tensors) alive, so memory a caller dropped early is not handed out again
    // while NCCL still reads or writes it.
    std::lock_guard<std::mutex> lock(mu_);
    // (A failed one stays: the watchdog reports it.)
    while (!inflight_.empty() && inflight_.front()->query().kind == detail::EventState::kDone) {
      inflight_.pop_front();
    }
    inflight_.push_back(work);
    return work;
  }

  // The watchdog (c10d's, in small): every 100 ms, the collectives in flight are checked in
  // order, finished ones dropped; the communicator is aborted when one failed on the GPU (its
  // CUDA error is the cause, not a dead peer), NCCL reports an asynchronous error, or the oldest
  // has not completed within the timeout. Every wait and launch after that throws CommError
  // with the cause.
  void watch() {
    // The thread is ours and ends here: its device is set once, never put back (a guard would
    // put back device 0 on the way out, and create a context there: CudaDeviceGuard).
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) return;
      std::string cause;
      while (!inflight_.empty()) {
        const auto state = inflight_.front()->query();
        if (state.kind == detail::EventState::kRunning) break;
        if (state.kind == detail::EventState::kFailed) {
          cause = fmt::format("{} failed on the GPU: {}", inflight_.front()->op(), state.error);
          break;
        }
        inflight_.pop_front();
      }
      if (cause.empty()) cause = comm_->async_error();
      if (cause.empty() && !inflight_.empty()) {
        const auto waited = std::chrono::steady_clock::now() - inflight_.front()->issued();
        if (waited > comm_->timeout()) {
          cause = fmt::format(
              "{} did not complete within {:.1f} s (the timeout): a peer died, hangs, or stopped "
              "issuing collectives",
              inflight_.front()->op(), std::chrono::duration<double>(waited).count());
        }
      }
      if (cause.empty()) continue;
      cause += "; the communicator was aborted (ncclCommAbort), this group cannot be used again";
      std::fprintf(stderr, "[nccl rank %d/%d] fsdp: %s\n", rank(), size(), cause.c_str());
      comm_->abort(cause);
      return;
    }
  }

  int device_;
  std::shared_ptr<NcclComm> comm_;
  int delay_ms_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;  // inflight_ and stopping_
  std::deque<std::shared_ptr<NcclWork>> inflight_;
  bool stopping_ = false;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;  // last: it starts after everything it reads
};

}  // namespace

bool has_nccl_backend() { return true; }

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

std::vector<uint8_t> make_nccl_unique_id() {
  ncclUniqueId id;
  FSDP_NCCL_CHECK(ncclGetUniqueId(&id), "unique_id", 0, -1);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  return std::vector<uint8_t>(bytes, bytes + sizeof(id));
}

ProcessGroupPtr make_nccl_group(int rank, int world_size, int device,
                                const std::vector<uint8_t>& unique_id,
                                std::chrono::milliseconds timeout) {
  FSDP_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size,
                 "make_nccl_group: rank {} is not in [0, {})", rank, world_size);
  FSDP_CHECK_ARG(unique_id.size() == sizeof(ncclUniqueId),
                 "make_nccl_group: unique_id has {} bytes, expected {}", unique_id.size(),
                 sizeof(ncclUniqueId));
  int devices = 0;
  FSDP_CUDA_CHECK(cudaGetDeviceCount(&devices), "init", rank, world_size);
  FSDP_CHECK_ARG(device >= 0 && device < devices,
                 "make_nccl_group: device {} is not in [0, {}) (visible CUDA devices)", device,
                 devices);
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  auto comm = detail::NcclComm::init(rank, world_size, device, id, timeout);
  return std::make_shared<NcclProcessGroup>(rank, world_size, std::move(comm));
}

}  // namespace fsdp
