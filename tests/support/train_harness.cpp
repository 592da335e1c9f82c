#include "support/train_harness.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "support/build_lock.h"

namespace fsdp::testing {

LocalGroupOptions test_options() {
  LocalGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  return options;
}

int64_t expected_shard_bytes(TinyLM& model, int world, int rank) {
  int64_t bytes = 0;
  for (const auto& p : unique_parameters(*model)) {
    auto r = shard_range(p.size(0), world, rank);
    bytes += r.rows() * (p.numel() / std::max<int64_t>(p.size(0), 1)) * 4;
  }
  return bytes;
}

std::mutex& model_build_mutex() {
  static std::mutex mu;
  return mu;
}

TinyLM build_model(const TrainSpec& spec) {
  std::lock_guard<std::mutex> lock(model_build_mutex());
  torch::manual_seed(spec.seed);
  TinyLM model(spec.model);
  if (spec.edit_model) spec.edit_model(model);
  model->to(spec.device);
  return model;
}

Unit<TinyLM> build_sharded_by_block(const TrainSpec& spec, const ProcessGroupPtr& pg,
                                    TinyLM& model) {
  FullyShardOptions options{spec.mp, spec.reshard_after_forward};
  std::lock_guard<std::mutex> lock(model_build_mutex());  // fully_shard does not communicate
  torch::manual_seed(spec.seed);
  model = TinyLM(spec.model, [&](int64_t, Unit<fsdp::models::minillm::TransformerBlock>& block) {
    fully_shard(block, pg, options);
  });
  return fully_shard(model, pg, options);
}

std::pair<at::Tensor, at::Tensor> global_batch(const TrainSpec& spec, int step) {
  auto gen = at::detail::createCPUGenerator(spec.seed * 1000 + step);
  auto tokens = at::randint(spec.model.vocab, {spec.batch, spec.seq}, gen, at::kLong);
  auto targets = at::randint(spec.model.output_size(), {spec.batch, spec.seq}, gen, at::kLong);
  return {tokens, targets};
}

at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets, int64_t classes) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, classes}), targets.reshape(-1));
}

void expect_parity(const std::string& label, int world, const TrainResult& got,
                   const TrainResult& want, double tolerance) {
  double loss_err = max_rel_loss_error(got, want);
  double param_err = max_rel_param_error(got, want);
  std::cout << label << " world " << world << ": loss rel err " << loss_err << ", param rel err "
            << param_err << "\n";
  EXPECT_LT(loss_err, tolerance) << label;
  EXPECT_LT(param_err, tolerance) << label;
}

namespace {

torch::optim::AdamW make_optimizer(std::vector<at::Tensor> params, const TrainSpec& spec) {
  return torch::optim::AdamW(std::move(params), torch::optim::AdamWOptions(spec.lr));
}

std::vector<std::pair<std::string, at::Tensor>> snapshot(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) {
    out.emplace_back(item.key(), item.value().detach().to(at::kCPU).to(at::kFloat).clone());
  }
  return out;
}

}  // namespace

TrainResult train_reference(const TrainSpec& spec, int slices) {
  TrainResult result;
  auto master = build_model(spec);
  auto opt = make_optimizer(unique_parameters(*master), spec);
  const bool mixed = spec.mp.param_dtype.has_value();
  TinyLM compute = mixed ? build_model(spec) : master;
  if (mixed) compute->to(*spec.mp.param_dtype);
  const int64_t local = spec.batch / slices;
  for (int step = 0; step < spec.steps; ++step) {
    auto [cpu_tokens, cpu_targets] = global_batch(spec, step);
    auto tokens = cpu_tokens.to(spec.device);
    auto targets = cpu_targets.to(spec.device);
    opt.zero_grad();
    if (mixed) {
      torch::NoGradGuard no_grad;
      auto src = unique_parameters(*master);
      auto dst = unique_parameters(*compute);
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    }
    // One process accumulating the slices' gradients: mathematically the global-batch
    // gradient, computed in the data-parallel order (slice means, then their average).
    std::vector<at::Tensor> grads;
    double loss_sum = 0;
    for (int s = 0; s < slices; ++s) {
      auto loss = loss_of(compute(tokens.narrow(0, s * local, local)),
                          targets.narrow(0, s * local, local), spec.model.output_size());
      loss.backward();
      loss_sum += loss.item<double>();
      auto params = unique_parameters(*compute);
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor g = params[i].grad().defined() ? params[i].grad().to(at::kFloat)
                                                  : at::zeros_like(params[i], at::kFloat);
        if (s == 0)
          grads.push_back(g.clone());
        else
          grads[i].add_(g);
        params[i].mutable_grad() = at::Tensor();
      }
    }
    auto params = unique_parameters(*master);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad()) params[i].mutable_grad() = grads[i].div_(slices);
    }
    opt.step();
    result.losses.push_back(loss_sum / slices);
  }
  result.params = snapshot(*master);
  return result;
}

Unit<TinyLM> shard_model(TinyLM& model, const ProcessGroupPtr& pg,
                         const FullyShardOptions& options) {
  for (auto& layer : model->layers) fully_shard(layer, pg, options);
  return fully_shard(model, pg, options);
}

Unit<TinyLM> shard_model(TinyLM& model, const ProcessGroupPtr& pg, const TrainSpec& spec) {
  return shard_model(model, flat_mesh(pg), spec);
}

Unit<TinyLM> shard_model(TinyLM& model, const DeviceMesh& mesh, const TrainSpec& spec) {
  FullyShardOptions options{spec.mp, spec.reshard_after_forward};
  options.activation_checkpointing = spec.checkpoint_blocks;
  options.offload_policy = spec.offload;
  for (auto& layer : model->layers) fully_shard(layer, mesh, options);
  options.activation_checkpointing = spec.checkpoint_root;
  return fully_shard(model, mesh, options);
}

at::Tensor gather_full(const ProcessGroupPtr& pg, const at::Tensor& shard, int64_t full_dim0) {
  int world = pg->size();
  auto range = shard_range(full_dim0, world, pg->rank());
  auto row_shape = shard.sizes().vec();
  row_shape[0] = range.rows_per_rank;
  // The buffers on the group's device, not the shard's: under CPU offload a shard is a pinned
  // host tensor and the NCCL group gathers CUDA tensors (as the runtime's own gathers do).
  const auto on_group = shard.options().device(pg->device()).pinned_memory(false);
  auto padded = at::zeros(row_shape, on_group);
  if (shard.numel() > 0) padded.narrow(0, 0, shard.size(0)).copy_(shard.detach());
  auto all_shape = row_shape;
  all_shape[0] = range.rows_per_rank * world;
  auto all = at::empty(all_shape, on_group);
  pg->all_gather(all, padded)->wait();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world; ++r) {
    auto rr = shard_range(full_dim0, world, r);
    parts.push_back(all.narrow(0, r * range.rows_per_rank, rr.rows()));
  }
  return at::cat(parts);
}

TrainResult train_sharded(const TrainSpec& spec, const ProcessGroupPtr& pg) {
  return train_sharded(spec, flat_mesh(pg));
}

TrainResult train_sharded(const TrainSpec& spec, const DeviceMesh& mesh) {
  TrainResult result;
  const ProcessGroupPtr& pg = mesh.world;  // data parallelism spans every replica
  // Thread ranks share libtorch's global generator, which activation checkpointing sets and
  // puts back during a backward's recompute (as PyTorch's checkpoint does): a rank still
  // training from an earlier run could roll it back under another rank's seeded model
  // building (seen as a 1e-7 difference in 1 of ~75 runs under load). No rank builds while
  // another trains, and no rank trains while another builds.
  pg->barrier()->wait();
  auto model = build_model(spec);
  std::vector<int64_t> dim0;
  for (const auto& p : model->parameters()) dim0.push_back(p.size(0));

  auto root = shard_model(model, mesh, spec);
  auto opt = make_optimizer(root.parameters(), spec);
  pg->barrier()->wait();

  int world = pg->size();
  int64_t local = spec.batch / world;
  const int64_t micro = local / spec.micro_batches;
  for (int step = 0; step < spec.steps; ++step) {
    auto [cpu_tokens, cpu_targets] = global_batch(spec, step);
    auto tokens = cpu_tokens.to(spec.device);
    auto targets = cpu_targets.to(spec.device);
    auto my_tokens = tokens.narrow(0, pg->rank() * local, local);
    auto my_targets = targets.narrow(0, pg->rank() * local, local);
    opt.zero_grad();
    at::Tensor loss_sum = at::zeros({}, at::kFloat);
    for (int k = 0; k < spec.micro_batches; ++k) {
      const bool last = k + 1 == spec.micro_batches;
      root.set_requires_gradient_sync(last || spec.sync_every_micro_batch);
      auto loss = loss_of(root(my_tokens.narrow(0, k * micro, micro)),
                          my_targets.narrow(0, k * micro, micro), spec.model.output_size()) /
                  spec.micro_batches;
      loss.backward();
      loss_sum += loss.detach().to(at::kCPU).to(at::kFloat);
    }
    opt.step();
    auto global = loss_sum.to(spec.device).reshape({1}).clone();
    pg->all_reduce(global, ReduceOp::kAvg)->wait();
    result.losses.push_back(global.item<double>());
  }
  size_t i = 0;
  for (const auto& item : model->named_parameters()) {
    result.params.emplace_back(
        item.key(), gather_full(mesh.shard, item.value(), dim0[i++]).to(at::kCPU).to(at::kFloat));
  }
  return result;
}

double max_rel_param_error(const TrainResult& got, const TrainResult& want) {
  double worst = 0;
  if (got.params.size() != want.params.size()) return 1e9;
  for (size_t i = 0; i < got.params.size(); ++i) {
    const auto& a = got.params[i].second;
    const auto& b = want.params[i].second;
    if (got.params[i].first != want.params[i].first || !a.sizes().equals(b.sizes())) return 1e9;
    double scale = std::max(b.abs().max().item<double>(), 1e-12);
    double err = (a - b).abs().max().item<double>() / scale;
    if (std::isnan(err)) return std::numeric_limits<double>::infinity();
    if (std::getenv("FSDP_TEST_VERBOSE")) std::cout << got.params[i].first << " " << err << "\n";
    worst = std::max(worst, err);
  }
  return worst;
}

double max_rel_loss_error(const TrainResult& got, const TrainResult& want) {
  double worst = 0;
  if (got.losses.size() != want.losses.size()) return 1e9;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    double err =
        std::abs(got.losses[i] - want.losses[i]) / std::max(std::abs(want.losses[i]), 1e-12);
    if (std::isnan(err)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace fsdp::testing
