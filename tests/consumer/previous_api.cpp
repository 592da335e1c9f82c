// A program written against fsdp 0.1.0 (commit cd9009e): its include paths, names and field
// spellings, unchanged. It must build against every later 0.x release that keeps 0.1.0's API
// deprecated rather than removed (with deprecation warnings, which is the point), and run the
// same: one process, a two-unit model sharded with fully_shard, a training step, 0.1.0's
// MemoryStats fields checked against the new ones, and a little of every other header.
// check_install.cmake builds and runs it against the installed package.
#include <fsdp/backends.h>
#include <fsdp/checkpoint.h>
#include <fsdp/clip_grad.h>
#include <fsdp/comm_stats.h>
#include <fsdp/device_memory.h>
#include <fsdp/device_mesh.h>
#include <fsdp/errors.h>
#include <fsdp/fake_group.h>
#include <fsdp/fully_shard.h>
#include <fsdp/fully_shard_options.h>
#include <fsdp/fused_adamw.h>
#include <fsdp/launch.h>
#include <fsdp/local_group.h>
#include <fsdp/memory_stats.h>
#include <fsdp/mixed_precision.h>
#include <fsdp/planner.h>
#include <fsdp/process_group.h>
#include <fsdp/profiler.h>
#include <fsdp/safetensors.h>
#include <fsdp/sharding.h>
#include <fsdp/unique_parameters.h>
#include <fsdp/whole_model.h>
#include <fsdp/work.h>
// The umbrella last: it must agree with everything above.
#include <fsdp/fsdp.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cout << "previous_api: FAILED: " << what << "\n";
  }
}

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(8, 8))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl()
      : block(register_module("block", Block())),
        head(register_module("head", torch::nn::Linear(8, 2))) {}
  at::Tensor forward(const at::Tensor& x) { return head(block(x)); }
  fsdp::Unit<Block> block;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

// 0.1.0's MemoryStats: eight members, the last five now under MemoryStats::tree (the old names
// are deprecated copies of them).
void memory_stats_fields(const fsdp::MemoryStats& m) {
  check(m.full_param_bytes == m.tree.full_param_bytes, "full_param_bytes");
  check(m.peak_full_param_bytes == m.tree.peak_full_param_bytes, "peak_full_param_bytes");
  check(m.comm_buffer_bytes == m.tree.comm_buffer_bytes, "comm_buffer_bytes");
  check(m.peak_comm_buffer_bytes == m.tree.peak_comm_buffer_bytes, "peak_comm_buffer_bytes");
  check(m.cached_buffer_bytes == m.tree.cached_buffer_bytes, "cached_buffer_bytes");
  check(m.peak_full_param_bytes >= m.full_param_bytes, "peak >= now");
  std::ostringstream printed;
  printed << m.peak_full_param_bytes;
  check(printed.str() == std::to_string(m.tree.peak_full_param_bytes), "stream output");
  const int64_t sum = m.peak_full_param_bytes + m.peak_comm_buffer_bytes;  // bench's sum
  check(sum == m.tree.peak_full_param_bytes + m.tree.peak_comm_buffer_bytes, "arithmetic");

  // Copies carry them (they are plain fields, filled by memory_stats()).
  fsdp::MemoryStats copy = m;
  check(copy.full_param_bytes == m.tree.full_param_bytes, "a copy keeps them");
  fsdp::MemoryStats zero{};
  check(zero.full_param_bytes == 0 && zero.cached_buffer_bytes == 0, "value initialisation");
}

// 0.1.0's launch strings.
void launch_strings() {
  fsdp::LaunchInfo info = fsdp::detect_launch([](const char*) -> const char* { return nullptr; });
  check(info.launcher == "single", "launcher == \"single\"");
  check(info.launcher != "torchrun", "launcher != \"torchrun\"");
  check(std::string("single") == info.launcher, "\"single\" == launcher");

  fsdp::InitOptions options;
  check(options.backend == "auto" && options.device == "auto", "defaults read as \"auto\"");
  options.backend = "local";
  options.device = std::string("cpu");
  check(options.backend == "local" && options.device == "cpu", "names assigned");
  options.backend = "auto";
  check(!options.backend.has_value(), "\"auto\" is no forced engine");
  fsdp::InitOptions listed{"auto", "cpu", std::chrono::seconds(30)};
  check(listed.device == "cpu" && listed.timeout == std::chrono::seconds(30), "aggregate");

  // 0.1.0 threw LaunchError for an unknown name from init_from_env; it comes from the
  // assignment now, so both sit inside the try.
  bool refused = false;
  try {
    options.backend = "carrier-pigeon";
    fsdp::init_from_env(options);
  } catch (const fsdp::LaunchError&) {
    refused = true;
  }
  check(refused, "an unknown engine is a LaunchError");
}

void planner() {
  fsdp::plan::PlanRequest req;
  fsdp::plan::UnitSpec root;
  root.name = "root";
  root.params = {fsdp::plan::ParamShape{8, 2}, fsdp::plan::ParamShape{2, 1}};
  root.reshard_after_forward = false;
  fsdp::plan::UnitSpec block;
  block.name = "block";
  block.params = {{8, 8}, {8, 1}};
  block.activation_bytes = 1024;
  req.units = {root, block};
  req.layout = fsdp::plan::Layout{4, 1, 0};
  req.dtypes = fsdp::plan::Dtypes{4, 2, 4};
  req.comm = fsdp::plan::CommModel::links(100e9, 10e9, 1e-5);
  fsdp::plan::Plan plan = fsdp::plan::make_plan(req);
  const fsdp::plan::MemoryPlan& memory = plan.memory;
  check(memory.total > 0, "plan total");
  for (const fsdp::plan::CollectivePlan& c : plan.collectives) {
    check(std::string(fsdp::plan::op_name(c.op)).size() > 0, "op_name");
  }
  check(!fsdp::plan::format_plan(req, plan).empty() && !fsdp::plan::plan_json(req, plan).empty(),
        "plan text");
  req.capacity_bytes = 1;
  bool refused = false;
  try {
    fsdp::plan::make_plan(req);
  } catch (const fsdp::plan::PlanError&) {
    refused = true;
  }
  check(refused, "PlanError");
}

void safetensors_files(const std::string& dir) {
  Net net;
  fsdp::NamedTensors tensors;
  for (const auto& p : net->named_parameters()) tensors.emplace_back(p.key(), p.value());
  const std::string path = dir + "/net.safetensors";
  fsdp::write_safetensors(path, tensors, {{"format", "pt"}});
  std::map<std::string, std::string> metadata;
  fsdp::NamedTensors back = fsdp::read_safetensors(path, &metadata);
  check(back.size() == tensors.size() && metadata["format"] == "pt", "safetensors round trip");
  fsdp::SafetensorsIndex index = fsdp::read_safetensors_index(path);
  const fsdp::SafetensorsEntry& first = index.entries.at(0);
  at::Tensor rows = fsdp::read_safetensors_rows(path, first, 0, 1);
  check(rows.size(0) == 1, "read_safetensors_rows");

  const std::string streamed = dir + "/streamed.safetensors";
  fsdp::SafetensorsWriter writer(streamed, {{"x", at::kFloat, {2, 3}}});
  writer.write_next(at::ones({2, 3}));
  writer.finish();

  Net other;
  fsdp::load_safetensors_into(*other, path);
  check(at::equal(other->head->weight, net->head->weight), "load_safetensors_into");
}

void process_groups() {
  fsdp::ProcessGroupPtr fake = fsdp::make_fake_group(1, 4);
  at::Tensor t = at::ones({3});
  fsdp::WorkPtr work = fake->all_reduce(t, fsdp::ReduceOp::kSum);
  work->wait();
  check(work->is_completed() && t[0].item<float>() == 4.0f, "fake group sum");
  const fsdp::CollectiveStats& stats = fake->stats();
  check(stats.count(fsdp::CollectiveKind::kAllReduce) == 1 &&
            stats.bytes_of(fsdp::CollectiveKind::kAllReduce) == 12,
        "collective stats");
  check(fsdp::kNumCollectiveKinds == 5 &&
            std::string(fsdp::collective_name(fsdp::CollectiveKind::kBarrier)).size() > 0,
        "collective kinds");
  fake->reset_stats();

  fsdp::LocalGroupOptions local;
  local.timeout = std::chrono::seconds(60);
  fsdp::run_local_ranks(
      2,
      [](const fsdp::ProcessGroupPtr& pg) {
        at::Tensor x = at::full({2}, static_cast<float>(pg->rank() + 1));
        pg->all_reduce(x, fsdp::ReduceOp::kAvg)->wait();
        if (x[0].item<float>() != 1.5f) throw fsdp::Error("local ranks averaged wrong");
      },
      local);
  std::vector<fsdp::ProcessGroupPtr> one = fsdp::make_local_groups(1);
  check(one.at(0)->backend_name() == "local" && one.at(0)->device_type() == at::kCPU,
        "local group");
}

}  // namespace

int main() {
  fsdp::track_host_tensor_memory();  // device_memory.h: first thing in main, as documented
  launch_strings();

  fsdp::InitOptions options;
  options.backend = "auto";
  options.device = "cpu";
  fsdp::Distributed d = fsdp::init_from_env(options);
  const fsdp::ProcessGroupPtr& pg = d.group;
  std::cout << "previous_api: launcher " << (d.launch.launcher == "single" ? "single" : "other")
            << ", backend " << pg->backend_name() << ", world " << pg->size() << "\n";
  std::cout << "previous_api: engines mpi " << fsdp::has_mpi_backend() << " nccl "
            << fsdp::has_nccl_backend() << " gloo " << fsdp::has_gloo_backend() << "\n";

  // fully_shard: the child unit first, then the root; one step with FusedAdamW and clipping.
  torch::manual_seed(0);
  Net model;
  fsdp::MixedPrecisionPolicy mp;
  mp.cast_forward_inputs = true;
  fsdp::FullyShardOptions unit_options;
  unit_options.mp_policy = mp;
  unit_options.reshard_after_forward = true;
  unit_options.activation_checkpointing = false;
  fsdp::fully_shard(model->block, pg, unit_options);
  fsdp::FullyShardOptions root_options;
  root_options.mp_policy = mp;
  fsdp::Unit<Net> root = fsdp::fully_shard(model, pg, root_options);
  check(root.is_sharded() && model->block.is_sharded(), "sharded");
  std::vector<at::Tensor> params = root.parameters();
  check(params.size() == fsdp::unique_parameters(*root.module()).size(), "unique_parameters");
  fsdp::FusedAdamW optimizer(params, torch::optim::AdamWOptions(1e-2));

  at::Tensor x = torch::randn({4, 8});
  at::Tensor loss = root(x).pow(2).mean();
  loss.backward();
  const double norm = fsdp::clip_grad_norm_(params, 1.0, pg);
  const double again = fsdp::total_grad_norm(params, pg);
  fsdp::DeviceMesh mesh = fsdp::make_device_mesh(pg, 1);
  const double by_mesh = fsdp::total_grad_norm(params, fsdp::flat_mesh(pg));
  check(norm > 0 && again <= 1.0 + 1e-4 && std::abs(by_mesh - again) < 1e-9 &&
            mesh.replicas() == 1 && !mesh.hybrid(),
        "clipping");
  optimizer.step();
  optimizer.zero_grad();

  root.set_requires_gradient_sync(true);
  root.unshard();
  root.reshard();
  fsdp::MemoryStats stats = root.memory_stats();
  memory_stats_fields(stats);
  fsdp::CommStats comm = root.comm_stats();
  check(comm.exposed_seconds >= 0, "comm stats");

  // Checkpoints and the whole-model export, into a scratch directory (POSIX calls, not
  // std::filesystem: libtorch exports broken copies of it, docs/libtorch.md).
  char scratch[] = "/tmp/fsdp_previous_api_XXXXXX";
  check(::mkdtemp(scratch) != nullptr, "scratch directory");
  const std::string dir = scratch;
  fsdp::SaveOptions save;
  save.keep_last = 1;
  save.metadata["run"] = "previous_api";
  const std::string saved = fsdp::save_checkpoint(dir, 1, *model, &optimizer, pg, save);
  check(fsdp::latest_checkpoint(dir) == saved, "latest_checkpoint");
  fsdp::CheckpointInfo info = fsdp::load_checkpoint(saved, *model, &optimizer, pg);
  check(info.step == 1 && info.world_size == 1 && info.metadata["run"] == "previous_api",
        "load_checkpoint");
  fsdp::ExportOptions export_options;
  export_options.dtype = at::kFloat;
  const std::string exported = dir + "/model.safetensors";
  fsdp::export_safetensors(exported, *model, pg, export_options);
  fsdp::load_safetensors_sharded(exported, *model, pg);
  safetensors_files(dir);
  check(std::system(("rm -rf '" + dir + "'").c_str()) == 0, "scratch directory removed");

  planner();
  process_groups();

  const fsdp::ShardRange range = fsdp::shard_range(10, 4, 3);
  check(range.rows_per_rank == 3 && range.begin == 9 && range.rows() == 1, "shard_range");

  fsdp::HostTensorMemory host = fsdp::host_tensor_memory();
  check(host.tracking && host.peak >= host.allocated, "host tensor memory");
  fsdp::reset_host_tensor_peak();
  check(fsdp::host_peak_rss_bytes() > 0, "peak RSS");

  fsdp::ProfileOptions profile_options;
  profile_options.record_shapes = false;
  fsdp::ProfileSummary summary;
  summary.ops.push_back(fsdp::OpStats{"aten::mm", 1, 0.5, 0.5});
  check(!fsdp::format_op_table(summary, 5).empty(), "format_op_table");
  fsdp::format_unit_waits(summary);

  // Names taken without being run here (they need engines, a GPU or a profiler session).
  auto* start = &fsdp::start_profiling;
  auto* stop = &fsdp::stop_profiling;
  auto* mpi = &fsdp::make_mpi_world_group;
  auto* gloo = &fsdp::make_gloo_group;
  auto* nccl = &fsdp::make_nccl_group;
  auto* nccl_id = &fsdp::make_nccl_unique_id;
  auto* cuda_peak = &fsdp::cuda_peak_allocated_bytes;
  auto* cuda_reset = &fsdp::cuda_reset_peak_allocated_bytes;
  fsdp::Distributed (*from_launch)(const fsdp::LaunchInfo&, const fsdp::InitOptions&) =
      &fsdp::init_from_launch;
  check(start && stop && mpi && gloo && nccl && nccl_id && cuda_peak && cuda_reset && from_launch,
        "functions");

  // The error types, each still an fsdp::Error.
  try {
    throw fsdp::TimeoutError("local", "all_reduce", 0, 1, "late");
  } catch (const fsdp::CommError& e) {
    check(e.backend() == "local" && e.op() == "all_reduce" && e.cause() == "late", "CommError");
  }
  check(std::is_base_of_v<fsdp::Error, fsdp::InvalidArgument> &&
            std::is_base_of_v<fsdp::Error, fsdp::FormatError> &&
            std::is_base_of_v<fsdp::Error, fsdp::LaunchError> &&
            std::is_base_of_v<fsdp::Error, fsdp::UnsupportedError> &&
            std::is_base_of_v<fsdp::Error, fsdp::CheckpointError>,
        "error types");

  if (failures != 0) {
    std::cout << "previous_api: " << failures << " failure(s)\n";
    return 1;
  }
  std::cout << "previous_api: 0.1.0's API builds and runs\n";
  return 0;
}
