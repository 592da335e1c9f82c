// train_minillm: the MiniLLM example trainer. Every block is a fully_shard unit, then the root;
// the training loop is the trainers' own (examples/trainer). See README.md beside this file.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>

#include "fsdp/fsdp.h"
#include "fsdp/models/minillm.h"
#include "loop.h"
#include "minillm_options.h"
#include "move_unsharded.h"
#include "shard_options.h"
#include "text_data.h"

namespace {

namespace mm = fsdp::models::minillm;
using minillm::Options;

std::unique_ptr<minillm::Dataset> open_data(const Options& o) {
  const auto& t = o.train;
  if (o.data == "synthetic") return minillm::make_synthetic_dataset(o.model.vocab, t.seq, t.seed);
  if (o.data == "auto") {
    if (std::filesystem::exists(minillm::kDefaultTextPath)) {
      return minillm::make_text_dataset(minillm::kDefaultTextPath, t.seq, t.seed);
    }
    return minillm::make_synthetic_dataset(o.model.vocab, t.seq, t.seed);
  }
  return minillm::make_text_dataset(o.data, t.seq, t.seed);
}

// Builds the model with the values a single process gets from --seed and shards it: every
// block a unit, then the root. By default each block is sharded as soon as it is built, so a
// rank never holds more than its shards, one full block and the root's own parameters
// (embedding, head); the random numbers are drawn in the same order as for the whole model, so
// the values are the same. --init-from then replaces them, each rank reading its own rows.
fsdp::Unit<mm::MiniLLM> build_sharded_model(const Options& o, const fsdp::Distributed& dist,
                                            const fsdp::DeviceMesh& mesh) {
  trainer::check_float8_device(o.model.float8, o.model.float8_scaling, dist);
  const auto block_options = trainer::shard_options(o.train, /*block=*/true);
  auto shard_block = [&](int64_t, fsdp::Unit<mm::TransformerBlock>& block) {
    block->to(dist.device);
    fsdp::fully_shard(block, mesh, block_options);
  };
  mm::MiniLLMImpl::BlockBuilt on_built;
  if (!o.train.init_full_model) on_built = shard_block;
  torch::manual_seed(o.train.seed);
  mm::MiniLLM model(o.model, on_built);
  if (o.train.init_full_model) {
    model->to(dist.device);
    for (size_t i = 0; i < model->layers.size(); ++i) shard_block(i, model->layers[i]);
  }
  // The root's own parameters (not the blocks' shards: host memory under --offload all).
  trainer::move_unsharded(*model, dist.device);
  auto root = fsdp::fully_shard(model, mesh, trainer::shard_options(o.train, /*block=*/false));
  if (!o.init_from.empty()) fsdp::load_safetensors_sharded(o.init_from, *model, dist.group);
  return root;
}

int run(const Options& o, const fsdp::LaunchInfo& launch) {
  auto dist = trainer::start_job(o.train, launch);
  const auto mesh = fsdp::make_device_mesh(dist.group, o.train.replicas);
  auto root = build_sharded_model(o, dist, mesh);
  auto data = open_data(o);
  trainer::Task task;
  task.root = root;
  task.module = root.module().ptr().get();
  task.logits = [&root](const torch::Tensor& tokens) { return root(tokens); };
  if (o.train.fused_loss) {
    // Through the root unit, which gathers its parameters around the call as forward does.
    task.fused_loss = [&root, chunk = o.train.loss_chunk](const torch::Tensor& tokens,
                                                          const torch::Tensor& targets) {
      return root.call(&mm::MiniLLMImpl::fused_loss, tokens, targets, chunk);
    };
  }
  task.vocab = o.model.vocab;
  task.train = data.get();
  task.info = {
      "MiniLLM",
      fmt::format("vocab {} dim {} layers {} heads {}{}{}", o.model.vocab, o.model.dim,
                  o.model.layers, o.model.heads,
                  o.model.float8 ? fmt::format(", float8 feed-forward{} ({})",
                                               o.model.float8_attention ? " and attention" : "",
                                               trainer::name(o.model.float8_scaling))
                                 : "",
                  o.train.fused_loss ? ", fused loss" : ""),
      mm::parameter_count(o.model), mm::train_flops_per_token(o.model, o.train.seq)};
  task.finish = [&] {
    if (o.export_path.empty()) return;
    fsdp::ExportOptions options;
    if (o.export_dtype == trainer::Dtype::bf16) options.dtype = torch::kBFloat16;
    fsdp::export_safetensors(o.export_path, *root.module(), dist.group, options);
    if (dist.group->rank() == 0) fmt::print("exported {}\n", o.export_path);
  };
  return trainer::run_training(o.train, task, dist, mesh);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return trainer::trainer_main(
      argc, argv, trainer::parse_into(options, minillm::parse_options),
      [&] { return trainer::run_plan(options.train, minillm::plan_model(options)); },
      [&](const fsdp::LaunchInfo& launch) { return run(options, launch); });
}
