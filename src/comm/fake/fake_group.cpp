#include "fsdp/comm/fake_group.h"

#include "comm/detail/op_queue.h"

namespace fsdp {
namespace {

class FakeProcessGroup final : public ProcessGroup {
 public:
  FakeProcessGroup(int rank, int size, at::Device device)
      : ProcessGroup(rank, size), device_(device) {}

  Backend backend() const override { return Backend::kFake; }
  at::DeviceType device_type() const override { return device_.type(); }
  at::Device device() const override { return device_; }

 protected:
  WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    auto n = input.numel();
    auto flat = output.view(-1);
    for (int r = 0; r < size(); ++r) flat.narrow(0, r * n, n).copy_(input.view(-1));
    return done();
  }

  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op) override {
    auto n = output.numel();
    output.view(-1).copy_(input.view(-1).narrow(0, rank() * n, n));
    if (op == ReduceOp::kSum) output.mul_(size());
    return done();
  }

  WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    if (op == ReduceOp::kSum) tensor.mul_(size());
    return done();
  }

  WorkPtr do_broadcast(const at::Tensor&, int) override { return done(); }
  WorkPtr do_barrier() override { return done(); }

  // The colors gathered through all_gather are this rank's, repeated: every simulated rank
  // chose the same color.
  std::shared_ptr<ProcessGroup> do_split(int, const std::vector<int>& members, int index) override {
    return std::make_shared<FakeProcessGroup>(index, static_cast<int>(members.size()), device_);
  }

 private:
  static WorkPtr done() { return completed_work(); }
  at::Device device_;
};

}  // namespace

ProcessGroupPtr make_fake_group(int rank, int world_size, at::DeviceType device) {
  return std::make_shared<FakeProcessGroup>(rank, world_size, at::Device(device));
}

ProcessGroupPtr make_fake_group(int rank, int world_size, at::Device device) {
  return std::make_shared<FakeProcessGroup>(rank, world_size, device);
}

}  // namespace fsdp
