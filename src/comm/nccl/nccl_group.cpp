// The NCCL backend: CUDA tensors, one rank per GPU. Collectives run on the group's own
// communication stream, ordered after the caller's stream by an event; Work::wait() makes the
// caller's stream wait for the collective's event, so the host never blocks inside a step
// (the design of c10d's ProcessGroupNCCL). Its watchdog, too: a thread aborts the communicator
// when a collective has not completed within the timeout or NCCL reports an asynchronous
// error, so a dead or stuck peer becomes a CommError instead of a hang.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/detail/reduce_util.h"
#include "comm/nccl/cuda_check.h"
#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"
#include "util/check.h"
#include "tools/range.h"

namespace fsdp {
namespace {

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

// Set once by the watchdog when it aborted the communicator; read by every wait and launch.
struct NcclHealth {
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string cause;
  std::string get() {
    std::lock_guard<std::mutex> lock(mu);
    return cause;
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(int device, cudaEvent_t done, ncclComm_t comm, std::vector<at::Tensor> keep_alive,
           std::function<void()> after_wait, bool host_blocking, int rank, int size, const char* op,
           std::shared_ptr<NcclHealth> health)
      : device_(device),
        done_(done),
        comm_(comm),
        keep_alive_(std::move(keep_alive)),
        after_wait_(std::move(after_wait)),
        host_blocking_(host_blocking),
        rank_(rank),
        size_(size),
        op_(op),
        health_(std::move(health)) {}

  const char* op() const { return op_; }
  std::chrono::steady_clock::time_point issued() const { return issued_; }

  ~NcclWork() override { cudaEventDestroy(done_); }

  bool is_completed() override { return cudaEventQuery(done_) == cudaSuccess; }

  void wait() override {
    detail::CudaDeviceGuard guard(device_);
    check_aborted();
    check_async_error();
    if (host_blocking_) {
      FSDP_CUDA_CHECK(cudaEventSynchronize(done_), "wait", rank_, size_);
      check_aborted();  // the watchdog's abort is what ended a stuck wait
    } else {
      FSDP_CUDA_CHECK(cudaStreamWaitEvent(detail::current_cuda_stream(device_), done_, 0), "wait",
                      rank_, size_);
    }
    // Runs on the caller's stream, which now follows the collective: copy-out of 16-bit
    // reductions accumulated in float32.
    if (after_wait_) {
      after_wait_();
      after_wait_ = nullptr;
    }
  }

 private:
  void check_aborted() {
    if (health_->aborted) throw CommError("nccl", op_, rank_, size_, health_->get());
  }

  void check_async_error() {
    if (health_->aborted) return;  // an aborted communicator is not to be queried
    ncclResult_t async = ncclSuccess;
    FSDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async), "wait", rank_, size_);
    if (async != ncclSuccess) {
      throw CommError("nccl", "wait", rank_, size_,
                      fmt::format("asynchronous NCCL error: {}", ncclGetErrorString(async)));
    }
  }

  int device_;
  cudaEvent_t done_;
  ncclComm_t comm_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> after_wait_;
  bool host_blocking_;
  int rank_, size_;
  const char* op_;
  std::shared_ptr<NcclHealth> health_;
  std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(int rank, int size, int device, ncclComm_t comm,
                   std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size), device_(device), comm_(comm), timeout_(timeout) {
    detail::CudaDeviceGuard guard(device_);
    FSDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "init", rank, size);
    if (timeout_.count() > 0) watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    watchdog_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    detail::CudaDeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    inflight_.clear();
    if (!health_->aborted) ncclCommDestroy(comm_);  // ncclCommAbort already freed it
    cudaStreamDestroy(stream_);
  }

  Backend backend() const override { return Backend::kNccl; }
  at::DeviceType device_type() const override { return at::kCUDA; }

 protected:
  WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    check_device("all_gather", {output, input});
    return launch("all_gather", {output, input}, nullptr, false, [&](cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                           nccl_type(input.scalar_type()), comm_, s);
    });
  }

  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op) override {
    check_device("reduce_scatter", {output, input});
    if (!detail::accumulates_in_fp32(input.scalar_type())) {
      return launch("reduce_scatter", {output, input}, nullptr, false, [&](cudaStream_t s) {
        return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                 nccl_type(input.scalar_type()), nccl_op(op), comm_, s);
      });
    }
    // NCCL sums 16-bit floats with rounding at every hop: reduce float32 copies instead.
    auto in32 = input.to(at::kFloat);
    auto out32 = at::empty({output.numel()}, output.options().dtype(at::kFloat));
    int world = size();
    auto copy_out = [output, out32, op, world] {
      detail::finish_reduction(output.view(-1), out32, op, world);
    };
    return launch("reduce_scatter", {output, input, in32, out32}, copy_out, false,
                  [&](cudaStream_t s) {
                    return ncclReduceScatter(in32.data_ptr(), out32.data_ptr(), out32.numel(),
                                             ncclFloat32, ncclSum, comm_, s);
                  });
  }

  WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    check_device("all_reduce", {tensor});
    if (!detail::accumulates_in_fp32(tensor.scalar_type())) {
      return launch("all_reduce", {tensor}, nullptr, false, [&](cudaStream_t s) {
        return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                             nccl_type(tensor.scalar_type()), nccl_op(op), comm_, s);
      });
    }
    auto buf = tensor.to(at::kFloat);
    int world = size();
    auto copy_out = [tensor, buf, op, world] { detail::finish_reduction(tensor, buf, op, world); };
    return launch("all_reduce", {tensor, buf}, copy_out, false, [&](cudaStream_t s) {
      return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), ncclFloat32, ncclSum, comm_,
                           s);
    });
  }

  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override {
    check_device("broadcast", {tensor});
    return launch("broadcast", {tensor}, nullptr, false, [&](cudaStream_t s) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.scalar_type()), root, comm_, s);
    });
  }

  WorkPtr do_barrier() override {
    detail::CudaDeviceGuard guard(device_);
    auto token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    // A barrier is a host-side promise: its wait() blocks until every rank arrived.
    return launch("barrier", {token}, nullptr, true, [&](cudaStream_t s) {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s);
    });
  }

  at::Device device() const override {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

  std::shared_ptr<ProcessGroup> do_split(int color, const std::vector<int>& members, int) override {
    detail::CudaDeviceGuard guard(device_);
    ncclComm_t child = nullptr;
    FSDP_NCCL_CHECK(ncclCommSplit(comm_, color, rank(), &child, nullptr), "split", rank(), size());
    int child_rank = 0;
    FSDP_NCCL_CHECK(ncclCommUserRank(child, &child_rank), "split", rank(), size());
    return std::make_shared<NcclProcessGroup>(child_rank, static_cast<int>(members.size()), device_,
                                              child, timeout_);
  }

 private:
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

  void check_device(const char* op, std::initializer_list<at::Tensor> tensors) const {
    for (const auto& t : tensors) {
      FSDP_CHECK_ARG(t.device().index() == device_,
                     "{}: tensor on {} but this NCCL group drives cuda:{}", op, t.device().str(),
                     device_);
    }
  }

  template <typename Issue>
  WorkPtr launch(const char* op, std::vector<at::Tensor> tensors, std::function<void()> after,
                 bool host_blocking, Issue issue) {
    if (health_->aborted) throw CommError("nccl", op, rank(), size(), health_->get());
    detail::CudaDeviceGuard guard(device_);
    cudaStream_t caller = detail::current_cuda_stream(device_);
    cudaEvent_t ready = nullptr, done = nullptr;
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), op, rank(), size());
    FSDP_CUDA_CHECK(cudaEventRecord(ready, caller), op, rank(), size());
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0), op, rank(), size());
    cudaEventDestroy(ready);  // safe: destruction is deferred until the event completes
    {
      // On the issuing thread: NVTX projects the range onto the kernels it launched, so
      // Nsight shows fsdp::comm::<op> on the NCCL stream.
      int64_t bytes = 0;
      for (const auto& t : tensors) bytes = std::max<int64_t>(bytes, t.nbytes());
      FSDP_RANGE_BYTES(std::string("fsdp::comm::") + op, bytes);
      FSDP_NCCL_CHECK(issue(stream_), op, rank(), size());
    }
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), op, rank(), size());
    FSDP_CUDA_CHECK(cudaEventRecord(done, stream_), op, rank(), size());
    auto work =
        std::make_shared<NcclWork>(device_, done, comm_, std::move(tensors), std::move(after),
                                   host_blocking, rank(), size(), op, health_);
    // Until its event completes the group keeps the Work (and so its tensors) alive, so memory
    // a caller dropped early is not handed out again while NCCL still reads or writes it.
    std::lock_guard<std::mutex> lock(mu_);
    while (!inflight_.empty() && inflight_.front()->is_completed()) inflight_.pop_front();
    inflight_.push_back(work);
    return work;
  }

  // The watchdog (c10d's, in small): every 100 ms, the oldest collective still running is
  // checked against the timeout, and the communicator against NCCL's asynchronous errors. On
  // either it aborts the communicator, which makes the stuck kernels return; every wait and
  // launch after that throws CommError with the cause.
  void watch() {
    detail::CudaDeviceGuard guard(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) return;
      while (!inflight_.empty() && inflight_.front()->is_completed()) inflight_.pop_front();
      std::string cause;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess) {
        cause = fmt::format("asynchronous NCCL error: {}", ncclGetErrorString(async));
      } else if (!inflight_.empty()) {
        const auto waited = std::chrono::steady_clock::now() - inflight_.front()->issued();
        if (waited > timeout_) {
          cause = fmt::format(
              "{} did not complete within {:.1f} s (the timeout): a peer died, hangs, or stopped "
              "issuing collectives",
              inflight_.front()->op(), std::chrono::duration<double>(waited).count());
        }
      }
      if (cause.empty()) continue;
      cause += "; the communicator was aborted (ncclCommAbort), this group cannot be used again";
      {
        std::lock_guard<std::mutex> health_lock(health_->mu);
        health_->cause = cause;
      }
      std::fprintf(stderr, "[nccl rank %d/%d] fsdp: %s\n", rank(), size(), cause.c_str());
      ncclCommAbort(comm_);
      health_->aborted = true;
      return;
    }
  }

  int device_;
  ncclComm_t comm_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;  // inflight_ and stopping_
  std::deque<std::shared_ptr<NcclWork>> inflight_;
  std::shared_ptr<NcclHealth> health_ = std::make_shared<NcclHealth>();
  bool stopping_ = false;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;  // last: it starts after everything it reads
};

}  // namespace

bool has_nccl_backend() { return true; }

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
  detail::CudaDeviceGuard guard(device);
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclComm_t comm = nullptr;
  FSDP_NCCL_CHECK(ncclCommInitRank(&comm, world_size, id, rank), "init", rank, world_size);
  return std::make_shared<NcclProcessGroup>(rank, world_size, device, comm, timeout);
}

}  // namespace fsdp
