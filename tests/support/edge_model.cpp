#include "support/edge_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "support/build_lock.h"

namespace fsdp::testing {

EdgeBlockImpl::EdgeBlockImpl(int index, int64_t dim, int64_t hidden, std::shared_ptr<Probe> probe)
    : index_(index), probe_(std::move(probe)) {
  fc1 = register_module("fc1", torch::nn::Linear(dim, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, dim));
}

at::Tensor EdgeBlockImpl::forward(const at::Tensor& x) {
  if (probe_ && probe_->on_forward) probe_->on_forward(index_, x);
  if (probe_ && probe_->throw_in_forward == index_) {
    throw std::runtime_error("block " + std::to_string(index_) + " failed in forward");
  }
  if (probe_ && probe_->identity_block == index_) return x;
  auto y = x + fc2(torch::relu(fc1(x)));
  if (probe_ && probe_->throw_in_backward == index_ && y.requires_grad()) {
    const int index = index_;
    y.register_hook([index](const at::Tensor&) -> at::Tensor {
      throw std::runtime_error("block " + std::to_string(index) + " failed in backward");
    });
  }
  return y;
}

EdgeNetImpl::EdgeNetImpl(const EdgeSpec& spec, std::shared_ptr<Probe> probe) : probe_(probe) {
  in = register_module("in", torch::nn::Linear(spec.dim, spec.dim));
  auto list = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < spec.blocks; ++i) {
    EdgeBlock b(i, spec.dim, spec.hidden, probe);
    list->push_back(b);
    blocks.emplace_back(b);
  }
  head = register_module("head", torch::nn::Linear(spec.dim, spec.classes));
}

at::Tensor EdgeNetImpl::forward(const at::Tensor& x) {
  auto h = in(x);
  for (auto& b : blocks) h = b(h);
  // The root's own forward fails after every block ran (probe: the index past the last block).
  if (probe_ && probe_->throw_in_forward == static_cast<int>(blocks.size())) {
    throw std::runtime_error("the root failed in forward");
  }
  return head(h);
}

at::Tensor EdgeNetImpl::encode(const at::Tensor& x) { return in(x); }

EdgeNet build_edge_net(const EdgeSpec& spec, std::shared_ptr<Probe> probe) {
  std::lock_guard<std::mutex> lock(model_build_mutex());  // threads share libtorch's generator
  torch::manual_seed(spec.seed);
  EdgeNet net(spec, std::move(probe));
  if (spec.edit) spec.edit(*net);
  return net;
}

Unit<EdgeNet> shard_edge_net(EdgeNet& net, const DeviceMesh& mesh, const EdgeSpec& spec) {
  for (auto& b : net->blocks) fully_shard(b, mesh, spec.options);
  return fully_shard(net, mesh, spec.options);
}

std::pair<at::Tensor, at::Tensor> edge_batch(const EdgeSpec& spec, int step) {
  auto gen = at::detail::createCPUGenerator(spec.seed * 1000 + step);
  auto x = at::randn({spec.batch, spec.dim}, gen);
  auto y = at::randint(spec.classes, {spec.batch}, gen, at::kLong);
  return {x, y};
}

EdgeResult run_edge(const EdgeSpec& spec, const DeviceMesh* mesh, const EdgeProgram& program,
                    std::shared_ptr<Probe> probe) {
  EdgeResult result;
  auto net = build_edge_net(spec, probe);
  std::unique_ptr<Unit<EdgeNet>> root;
  if (mesh) root = std::make_unique<Unit<EdgeNet>>(shard_edge_net(net, *mesh, spec));
  torch::optim::AdamW opt(unique_parameters(*net), torch::optim::AdamWOptions(spec.lr));
  const ProcessGroupPtr world = mesh ? mesh->world : nullptr;
  const int ranks = world ? world->size() : 1;
  const int64_t local = spec.batch / ranks;
  for (int step = 0; step < spec.steps; ++step) {
    auto [x, y] = edge_batch(spec, step);
    const int64_t first = world ? world->rank() * local : 0;
    auto mine_x = x.narrow(0, first, local), mine_y = y.narrow(0, first, local);
    double last = 0;
    EdgeStep ctx{step,
                 [&]() {
                   auto logits = root ? (*root)(mine_x) : net(mine_x);
                   auto loss = torch::nn::functional::cross_entropy(logits, mine_y);
                   last = loss.item<double>();
                   return loss;
                 },
                 [&](int k, int parts) {
                   if (local % parts != 0) {
                     throw std::invalid_argument("edge test: the rank's slice of " +
                                                 std::to_string(local) +
                                                 " rows does not split "
                                                 "into " +
                                                 std::to_string(parts) + " parts");
                   }
                   const int64_t n = local / parts;
                   auto xs = mine_x.narrow(0, k * n, n), ys = mine_y.narrow(0, k * n, n);
                   auto logits = root ? (*root)(xs) : net(xs);
                   auto loss = torch::nn::functional::cross_entropy(logits, ys) / parts;
                   last = (k == 0 ? 0 : last) + loss.item<double>();
                   return loss;
                 },
                 opt,
                 *net,
                 root.get(),
                 world};
    program(ctx);
    if (world) {
      auto l = at::full({1}, last, at::kDouble);
      world->all_reduce(l, ReduceOp::kAvg)->wait();
      last = l.item<double>();
    }
    result.losses.push_back(last);
  }
  if (world) {
    result.params = get_full_model_state_dict(*net, world);
  } else {
    for (const auto& p : net->named_parameters()) {
      result.params.emplace_back(p.key(), p.value().detach().clone());
    }
  }
  return result;
}

double max_rel_error(const EdgeResult& got, const EdgeResult& want) {
  if (got.params.size() != want.params.size() || got.losses.size() != want.losses.size()) {
    return std::numeric_limits<double>::infinity();
  }
  double worst = 0;
  for (size_t i = 0; i < got.params.size(); ++i) {
    const auto& a = got.params[i].second;
    const auto& b = want.params[i].second;
    if (got.params[i].first != want.params[i].first || !a.sizes().equals(b.sizes())) {
      return std::numeric_limits<double>::infinity();
    }
    const double err =
        (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
    worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(worst, err);
  }
  for (size_t i = 0; i < got.losses.size(); ++i) {
    const double err =
        std::abs(got.losses[i] - want.losses[i]) / std::max(std::abs(want.losses[i]), 1e-12);
    worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(worst, err);
  }
  return worst;
}

}  // namespace fsdp::testing
