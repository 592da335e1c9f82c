// A small model for the runtime's edge cases (zero_grad anywhere, freezing, failures, FSDP2's
// module API), with sizes that divide by nothing, and a runner that executes the same training
// program unsharded in one process (the reference) and sharded over a group.
//
// EdgeNet: in (Linear dim -> dim) -> blocks (each a Unit: x + fc2(relu(fc1(x)))) -> head
// (Linear dim -> classes). A Probe shared by the blocks can make one block throw in its
// forward, hook a throwing backward on its output, or watch the inputs a block receives.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp.h"
#include "support/torch_api.h"

namespace fsdp::testing {

struct Probe {
  // The block whose forward throws (-1: none; the number of blocks: the root, after them).
  int throw_in_forward = -1;
  int throw_in_backward = -1;  // the block whose output's gradient hook throws
  int identity_block = -1;     // the block that returns its input (its parameters unused)
  // Called at the start of every block's forward with its index and input.
  std::function<void(int, const at::Tensor&)> on_forward;
};

class EdgeBlockImpl : public torch::nn::Module {
 public:
  EdgeBlockImpl(int index, int64_t dim, int64_t hidden, std::shared_ptr<Probe> probe);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  int index_;
  std::shared_ptr<Probe> probe_;
};
TORCH_MODULE(EdgeBlock);

struct EdgeSpec {
  int blocks = 3;
  int64_t dim = 10, hidden = 14, classes = 3;
  int steps = 6;
  int64_t batch = 12;  // global: divides by 1, 2, 3 and 4
  double lr = 1e-2;
  uint64_t seed = 7;
  FullyShardOptions options;  // for every unit
  // Applied to the freshly built model, before sharding.
  std::function<void(class EdgeNetImpl&)> edit;
};

class EdgeNetImpl : public torch::nn::Module {
 public:
  EdgeNetImpl(const EdgeSpec& spec, std::shared_ptr<Probe> probe);
  at::Tensor forward(const at::Tensor& x);
  // A second method to run through FSDP (Unit::call): the input projection alone.
  at::Tensor encode(const at::Tensor& x);
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<Unit<EdgeBlock>> blocks;

 private:
  std::shared_ptr<Probe> probe_;
};
TORCH_MODULE(EdgeNet);

// Builds the model of `spec` (the same values on every thread for a seed).
EdgeNet build_edge_net(const EdgeSpec& spec, std::shared_ptr<Probe> probe);
// Every block a unit, then the root, over `mesh` with spec.options.
Unit<EdgeNet> shard_edge_net(EdgeNet& net, const DeviceMesh& mesh, const EdgeSpec& spec);

// The global batch of `step`: inputs [batch, dim], class targets [batch].
std::pair<at::Tensor, at::Tensor> edge_batch(const EdgeSpec& spec, int step);

// What a program sees at each step. `loss()` runs the model on this rank's slice (the whole
// batch for the reference) and returns the mean loss, recording it for the step; it may be
// called several times (the last call counts) or throw (a failed step). `loss_part(k, parts)`:
// the same on the k-th of `parts` equal parts of the slice (micro-batches), divided by
// `parts`, so that the parts' gradients add up to the slice's.
struct EdgeStep {
  int step = 0;
  std::function<at::Tensor()> loss;
  std::function<at::Tensor(int, int)> loss_part;
  torch::optim::Optimizer& opt;
  EdgeNetImpl& net;
  FSDPModule* root = nullptr;  // null in the reference run
  ProcessGroupPtr pg;          // null in the reference run
};
using EdgeProgram = std::function<void(EdgeStep&)>;

struct EdgeResult {
  std::vector<double> losses;                              // global mean loss per step
  std::vector<std::pair<std::string, at::Tensor>> params;  // full parameters at the end
};

// Runs `program` for spec.steps steps with AdamW(spec.lr): unsharded in this thread when
// `mesh` is null, else sharded (every rank of mesh->world calls it).
EdgeResult run_edge(const EdgeSpec& spec, const DeviceMesh* mesh, const EdgeProgram& program,
                    std::shared_ptr<Probe> probe = nullptr);

// max |a - b| / max |b| over matching parameters and over the losses.
double max_rel_error(const EdgeResult& got, const EdgeResult& want);

}  // namespace fsdp::testing
