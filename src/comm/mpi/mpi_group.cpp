// The MPI backend: CPU tensors, blocking MPI collectives run in order on the group's worker
// thread (detail::OpQueue) so callers overlap communication with compute.
#include <algorithm>
#include <climits>
#include <mutex>

#include "comm/detail/op_queue.h"
#include "comm/detail/reduce_util.h"
#include "comm/mpi/mpi_runtime.h"
#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"

namespace fsdp {
namespace {

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kByte:
      return MPI_UINT8_T;
    // Only byte moves see float16 (as_bits); reductions of 16-bit floats run on float32 copies.
    case at::kHalf:
      return MPI_UINT16_T;
    default:
      throw UnsupportedError(
          fmt::format("backend mpi has no MPI datatype for {}", c10::toString(t)));
  }
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(std::shared_ptr<detail::MpiRuntime> runtime, MPI_Comm comm, int rank, int size,
                  std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size),
        runtime_(std::move(runtime)),
        comm_(comm),
        timeout_(timeout),
        queue_(std::make_unique<detail::OpQueue>(deadline())) {}

  ~MpiProcessGroup() override {
    if (runtime_->broken()) {
      // The worker is stuck in a collective MPI cannot cancel: joining it (or freeing the
      // communicator under it) would hang. Leak both; the runtime aborts the job.
      (void)queue_.release();
      return;
    }
    queue_.reset();  // finish queued collectives before the communicator goes
    std::lock_guard<std::mutex> lock(serial_mu());
    MPI_Comm_free(&comm_);
  }

  Backend backend() const override { return Backend::kMpi; }
  at::DeviceType device_type() const override { return at::kCPU; }

 protected:
  WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    return queue_->submit("fsdp::comm::all_gather", output.nbytes(), [=] {
      auto in = detail::as_bits(input);
      auto out = detail::as_bits(output);
      call("all_gather", [&] {
        return MPI_Allgather(in.data_ptr(), count(in), mpi_type(in.scalar_type()), out.data_ptr(),
                             count(in), mpi_type(out.scalar_type()), comm_);
      });
    });
  }

  // An all-to-all, then a local sum in rank order. It moves the same bytes as a ring
  // reduce-scatter, but the result is deterministic and bit-identical to the thread-rank
  // backend and to a single process summing the ranks' contributions in order (MPI's own
  // reduction order varies with world size and algorithm), and 16-bit inputs travel in 16 bits
  // while being summed in float32. It runs in chunks through a small reused receive buffer
  // (world x kChunkElements), so a large reduction neither allocates an input-sized buffer nor
  // leaves the data to go cold before it is summed.
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op) override {
    return queue_->submit("fsdp::comm::reduce_scatter", input.nbytes(), [=] {
      const int64_t n = output.numel();
      const int world = size();
      count(input);  // displacements are ints: the whole input must fit
      const int64_t chunk = std::min<int64_t>(n, kChunkElements);
      if (!scratch_.defined() || scratch_.scalar_type() != input.scalar_type() ||
          scratch_.numel() < world * chunk) {
        scratch_ = at::empty({world * std::max<int64_t>(chunk, 1)}, input.options());
      }
      auto in = detail::as_bits(input);
      auto recv = detail::as_bits(scratch_);
      auto type = mpi_type(in.scalar_type());
      auto out = output.view(-1);
      std::vector<int> counts(world), send_at(world), recv_at(world);
      for (int64_t at_elem = 0; at_elem < n; at_elem += chunk) {
        const int64_t c = std::min(chunk, n - at_elem);
        for (int r = 0; r < world; ++r) {
          counts[r] = static_cast<int>(c);
          send_at[r] = static_cast<int>(r * n + at_elem);
          recv_at[r] = static_cast<int>(r * c);
        }
        call("reduce_scatter", [&] {
          return MPI_Alltoallv(in.data_ptr(), counts.data(), send_at.data(), type, recv.data_ptr(),
                               counts.data(), recv_at.data(), type, comm_);
        });
        auto parts = scratch_.narrow(0, 0, world * c).view({world, c});
        auto sum = detail::sum_in_rank_order(world, [&](int r) { return parts[r]; });
        detail::finish_reduction(out.narrow(0, at_elem, c), sum, op, world);
      }
    });
  }

  WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return queue_->submit("fsdp::comm::all_reduce", tensor.nbytes(), [=] {
      auto buf = detail::accumulation_buffer(tensor);
      call("all_reduce", [&] {
        return MPI_Allreduce(MPI_IN_PLACE, buf.data_ptr(), count(buf), mpi_type(buf.scalar_type()),
                             MPI_SUM, comm_);
      });
      detail::finish_reduction(tensor, buf, op, size());
    });
  }

  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override {
    return queue_->submit("fsdp::comm::broadcast", tensor.nbytes(), [=] {
      auto buf = detail::as_bits(tensor);
      call("broadcast", [&] {
        return MPI_Bcast(buf.data_ptr(), count(buf), mpi_type(buf.scalar_type()), root, comm_);
      });
    });
  }

  WorkPtr do_barrier() override {
    return queue_->submit("fsdp::comm::barrier", 0,
                          [=] { call("barrier", [&] { return MPI_Barrier(comm_); }); });
  }

  std::shared_ptr<ProcessGroup> do_split(int color, const std::vector<int>&, int) override {
    MPI_Comm child = MPI_COMM_NULL;
    // Through the queue: MPI requires collectives on one communicator to be issued in the
    // same order everywhere, so it must not race the worker's collectives.
    queue_
        ->submit(
            "fsdp::comm::split", 0,
            [&] { call("split", [&] { return MPI_Comm_split(comm_, color, rank(), &child); }); })
        ->wait();
    int child_rank = 0, child_size = 0;
    FSDP_MPI_CHECK(MPI_Comm_rank(child, &child_rank), "split", rank(), size());
    FSDP_MPI_CHECK(MPI_Comm_size(child, &child_size), "split", rank(), size());
    FSDP_MPI_CHECK(MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN), "split", rank(), size());
    return std::make_shared<MpiProcessGroup>(runtime_, child, child_rank, child_size, timeout_);
  }

 private:
  // MPI collectives block until every rank joins and cannot be cancelled, so a dead or stuck
  // peer would hang this rank forever: a wait gives up after the timeout with CommError, and
  // the runtime then ends the job (MpiRuntime::abort_job_later).
  detail::QueueDeadline deadline() const {
    detail::QueueDeadline d;
    d.timeout = timeout_;
    // A weak reference: the leaked queue of a broken group must not keep the runtime alive,
    // whose destruction aborts the job.
    d.on_timeout = [weak_runtime = std::weak_ptr<detail::MpiRuntime>(runtime_), rank = rank(),
                    size = size()](const char* label, std::chrono::milliseconds waited) {
      std::string op = label;
      if (op.rfind("fsdp::comm::", 0) == 0) op = op.substr(12);
      const double secs = waited.count() / 1e3;
      const auto cause = fmt::format(
          "did not complete within {:.1f} s (the timeout): a peer died, hangs, or stopped "
          "issuing collectives. MPI cannot cancel a collective, so the job will be aborted "
          "(MPI_Abort) when this process destroys its MPI groups, or in {} s",
          secs, kAbortGrace.count() / 1000);
      if (auto runtime = weak_runtime.lock()) {
        runtime->abort_job_later(fmt::format("[mpi rank {}/{}] fsdp: {} {}", rank, size, op, cause),
                                 kAbortGrace);
      }
      throw TimeoutError("mpi", op, rank, size, cause);
    };
    return d;
  }
  static constexpr std::chrono::milliseconds kAbortGrace{10000};

  // MPI counts are int; bigger flat buffers would need chunking, which FSDP's per-group buffers
  // (at most a few GB) have not needed.
  int count(const at::Tensor& t) const {
    if (t.numel() > INT_MAX) {
      throw UnsupportedError(fmt::format(
          "backend mpi: a message of {} elements exceeds MPI's int count limit", t.numel()));
    }
    return static_cast<int>(t.numel());
  }

  // With less than MPI_THREAD_MULTIPLE all groups share one lock around MPI calls.
  static std::mutex& serial_mu() {
    static std::mutex mu;
    return mu;
  }

  template <typename Fn>
  void call(const char* op, Fn fn) {
    int rc;
    if (runtime_->thread_multiple()) {
      rc = fn();
    } else {
      std::lock_guard<std::mutex> lock(serial_mu());
      rc = fn();
    }
    if (rc != MPI_SUCCESS) {
      throw CommError("mpi", op, rank(), size(), detail::mpi_error_string(rc));
    }
  }

  // Elements per rank per all-to-all round of reduce_scatter: 1 MiB of float32.
  static constexpr int64_t kChunkElements = 1 << 18;

  std::shared_ptr<detail::MpiRuntime> runtime_;
  MPI_Comm comm_;
  std::chrono::milliseconds timeout_;
  at::Tensor scratch_;  // reduce_scatter's receive buffer; used by the worker thread only
  std::unique_ptr<detail::OpQueue> queue_;
};

}  // namespace

bool has_mpi_backend() { return true; }

ProcessGroupPtr make_mpi_world_group(std::chrono::milliseconds timeout) {
  auto runtime = detail::MpiRuntime::acquire();
  int rank = 0, size = 0;
  FSDP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "init", -1, -1);
  FSDP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size), "init", rank, -1);
  MPI_Comm comm = MPI_COMM_NULL;
  // A private communicator: user traffic on MPI_COMM_WORLD cannot interleave with ours.
  FSDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "init", rank, size);
  FSDP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "init", rank, size);
  return std::make_shared<MpiProcessGroup>(runtime, comm, rank, size, timeout);
}

}  // namespace fsdp
