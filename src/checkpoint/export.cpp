// export_safetensors (fsdp/checkpoint/export.h): the model gathered one tensor at a time,
// written by rank 0 as each arrives, published atomically.
#include "fsdp/checkpoint/export.h"

#include <fmt/format.h>

#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/comm/agree.h"
#include "fsdp/io/files.h"
#include "util/check.h"

namespace fsdp {

void export_safetensors(const std::string& path, const torch::nn::Module& model,
                        const ProcessGroupPtr& pg, const ExportOptions& options) {
  FSDP_CHECK_ARG(pg != nullptr, "export_safetensors: the process group is null");
  auto& g = *pg;
  const bool writer_rank = g.rank() == 0;
  const std::string tmp = io::staging_path(path);
  const std::string what = fmt::format("export_safetensors {}", path);
  std::unique_ptr<SafetensorsWriter> writer;
  agree_on<CheckpointError>(g, what, [&] {
    // On every rank: reading the state dict first resets a tree left stale by a failed step,
    // which may finish reductions in flight (collectives every rank must join).
    const auto state = get_model_state_dict(model);
    if (!writer_rank) return;
    io::check_publishable(path);  // before the staged copy fills a disk (/dev/full.tmp: /dev)
    io::make_directories(io::parent_directory(path));  // as the directory exports do
    std::vector<SafetensorsWriter::Spec> specs;
    for (const auto& [name, t] : state) {
      const auto dtype =
          options.dtype && t.local.is_floating_point() ? *options.dtype : t.local.scalar_type();
      specs.push_back({name, dtype, t.global_shape});
    }
    writer = std::make_unique<SafetensorsWriter>(tmp, std::move(specs), options.metadata);
  });
  // Every rank joins every gather; a write error on rank 0 stops its writing and is reported
  // after the last gather.
  std::string error;
  FullStateDictOptions full;
  full.rank0_only = true;
  full.dtype = options.dtype;
  for_each_full_tensor(model, pg, full, [&](const std::string&, const at::Tensor& t) {
    if (!error.empty()) return;
    try {
      writer->write_next(t);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  agree_on<CheckpointError>(g, what, [&] {
    if (!writer_rank) return;
    try {
      if (!error.empty()) throw CheckpointError(error);
      writer->finish();
      io::publish(tmp, path);
    } catch (...) {
      // The half-written file goes; `path` was never touched. The first error is the one
      // reported.
      try {
        writer.reset();
        io::remove_tree(tmp);
      } catch (const std::exception&) {
      }
      throw;
    }
  });
}

}  // namespace fsdp
