// The Gloo backend through libtorch's c10d::ProcessGroupGloo: CPU tensors for torchrun-style
// launches, where no mpirun started the processes. Chosen because every PyTorch build carries it,
// with timeouts that turn a dead peer into an error. In libtorch 2.x it is a c10d::Backend, used
// here only through that interface; gloo's own headers are absent from the wheel, so the
// declarations in gloo_decls/ stand in for them (see gloo_decls/README.md).
#include <cstdlib>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/detail/op_queue.h"
#include "comm/detail/reduce_util.h"
#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp {
namespace {

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   std::chrono::milliseconds timeout, int64_t split_prefix_depth = 0)
      : ProcessGroup(rank, size), store_(store), timeout_(timeout), depth_(split_prefix_depth) {
    try {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(make_device());
      gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    } catch (const std::exception& e) {
      throw CommError("gloo", "init", rank, size, e.what());
    }
  }

  Backend backend() const override { return Backend::kGloo; }
  at::DeviceType device_type() const override { return at::kCPU; }

 protected:
  WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    return queue_.submit("fsdp::comm::all_gather", output.nbytes(), [=] {
      if (input.numel() == 0) return;
      // Gathers move bytes: bfloat16 travels as float16 bit patterns, unchanged.
      auto in = detail::as_bits(input).view(-1);
      auto out = detail::as_bits(output).view(-1);
      run("all_gather", [&] { return gloo_->_allgather_base(out, in); });
    });
  }

  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op) override {
    // Gloo's _reduce_scatter_base (libtorch 2.x) is an all-reduce of the whole input plus a
    // copy of this rank's slice: size() times the bytes of a ring reduce-scatter. Acceptable for
    // the CPU env-launch path; MPI is the fast CPU engine. 16-bit inputs are summed in float32.
    return queue_.submit("fsdp::comm::reduce_scatter", input.nbytes(), [=] {
      auto in = detail::accumulates_in_fp32(input.scalar_type()) ? input.to(at::kFloat)
                                                                 : input.contiguous();
      auto out = at::empty({output.numel()}, in.options());
      auto in_flat = in.view(-1);
      run("reduce_scatter", [&] { return gloo_->_reduce_scatter_base(out, in_flat); });
      detail::finish_reduction(output.view(-1), out, op, size());
    });
  }

  WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return queue_.submit("fsdp::comm::all_reduce", tensor.nbytes(), [=] {
      auto buf = detail::accumulation_buffer(tensor);
      std::vector<at::Tensor> tensors{buf.view(-1)};
      run("all_reduce", [&] { return gloo_->allreduce(tensors); });
      detail::finish_reduction(tensor, buf, op, size());
    });
  }

  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override {
    return queue_.submit("fsdp::comm::broadcast", tensor.nbytes(), [=] {
      std::vector<at::Tensor> tensors{detail::as_bits(tensor).view(-1)};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      run("broadcast", [&] { return gloo_->broadcast(tensors, opts); });
    });
  }

  WorkPtr do_barrier() override {
    return queue_.submit("fsdp::comm::barrier", 0,
                         [=] { run("barrier", [&] { return gloo_->barrier(); }); });
  }

  std::shared_ptr<ProcessGroup> do_split(int color, const std::vector<int>& members,
                                         int index) override {
    // Each split gets its own key space in the store so its rendezvous cannot collide.
    auto prefix = fmt::format("fsdp_split/{}/{}/{}", depth_, split_count_++, color);
    auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
    return std::make_shared<GlooProcessGroup>(store, index, static_cast<int>(members.size()),
                                              timeout_, depth_ + 1);
  }

 private:
  static std::shared_ptr<::gloo::transport::Device> make_device() {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    }
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  template <typename Issue>
  void run(const char* op, Issue issue) {
    try {
      auto work = issue();
      work->wait();
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError("gloo", op, rank(), size(), e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  int64_t depth_;
  int64_t split_count_ = 0;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
  detail::OpQueue queue_;  // declared last: joined first, while gloo_ is still alive
};

}  // namespace

bool has_gloo_backend() { return true; }

ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                int world_size, std::chrono::milliseconds timeout) {
  FSDP_CHECK_ARG(store, "make_gloo_group: store is null");
  FSDP_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size,
                 "make_gloo_group: rank {} is not in [0, {})", rank, world_size);
  return std::make_shared<GlooProcessGroup>(store, rank, world_size, timeout);
}

}  // namespace fsdp
