#include "fsdp/comm/process_group.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp {
namespace {

bool is_supported_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf:
    case at::kInt:
    case at::kLong:
    case at::kByte:
      return true;
    default:
      return false;
  }
}

bool is_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// True when the byte ranges of a and b intersect.
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto a0 = reinterpret_cast<uintptr_t>(a.data_ptr());
  auto b0 = reinterpret_cast<uintptr_t>(b.data_ptr());
  auto a1 = a0 + a.nbytes();
  auto b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1;
}

// The result of a collective a one-rank group did itself: nothing left to wait for (on CUDA
// the copy is queued on the caller's stream, which is what wait() orders after).
WorkPtr completed() { return completed_work(); }

bool desync_env() {
  const char* v = std::getenv("FSDP_DEBUG_DESYNC");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

}  // namespace

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kMpi:
      return "mpi";
    case Backend::kNccl:
      return "nccl";
    case Backend::kGloo:
      return "gloo";
    case Backend::kLocal:
      return "local";
    case Backend::kFake:
      return "fake";
  }
  return "unknown";
}

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

ProcessGroup::ProcessGroup(int rank, int size)
    : rank_(rank), size_(size), desync_check_(desync_env()) {
  FSDP_CHECK_ARG(size >= 1, "process group size must be >= 1, got {}", size);
  FSDP_CHECK_ARG(rank >= 0 && rank < size, "process group rank must be in [0, {}), got {}", size,
                 rank);
}

void ProcessGroup::check_tensor(const char* op, const char* name, const at::Tensor& t) const {
  FSDP_CHECK_ARG(t.defined(), "{}: {} is an undefined tensor", op, name);
  FSDP_CHECK_ARG(t.is_contiguous(), "{}: {} must be contiguous (got sizes {}, strides {})", op,
                 name, fmt::join(t.sizes(), ","), fmt::join(t.strides(), ","));
  FSDP_CHECK_ARG(is_supported_dtype(t.scalar_type()),
                 "{}: {} has dtype {}; expected one of float32, float64, bfloat16, float16, "
                 "int32, int64, uint8",
                 op, name, c10::toString(t.scalar_type()));
  FSDP_CHECK_ARG(t.device().type() == device_type(),
                 "{}: {} is on device {} but the {} process group works on {} tensors", op, name,
                 t.device().str(), backend_name(), c10::DeviceTypeName(device_type(), true));
}

void ProcessGroup::count(CollectiveKind kind, const at::Tensor& t) {
  stats_.calls[static_cast<int>(kind)] += 1;
  stats_.bytes[static_cast<int>(kind)] += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

WorkPtr ProcessGroup::all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_tensor("all_gather", "input", input);
  check_tensor("all_gather", "output", output);
  FSDP_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "all_gather: output dtype {} differs from input dtype {}",
                 c10::toString(output.scalar_type()), c10::toString(input.scalar_type()));
  FSDP_CHECK_ARG(output.device() == input.device(), "all_gather: output on {} but input on {}",
                 output.device().str(), input.device().str());
  FSDP_CHECK_ARG(output.numel() == size_ * input.numel(),
                 "all_gather: output numel must be world size x input numel = {} x {} = {}, got {}",
                 size_, input.numel(), size_ * input.numel(), output.numel());
  FSDP_CHECK_ARG(!overlaps(output, input), "all_gather: output and input must not overlap");
  check_in_sync(CollectiveKind::kAllGather, input.numel(), input.scalar_type(), -1);
  count(CollectiveKind::kAllGather, input);
  if (answers_locally()) {
    at::NoGradGuard no_grad;
    output.copy_(input);
    return completed();
  }
  return do_all_gather(output, input);
}

WorkPtr ProcessGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                     ReduceOp op) {
  check_tensor("reduce_scatter", "input", input);
  check_tensor("reduce_scatter", "output", output);
  FSDP_CHECK_ARG(output.scalar_type() == input.scalar_type(),
                 "reduce_scatter: output dtype {} differs from input dtype {}",
                 c10::toString(output.scalar_type()), c10::toString(input.scalar_type()));
  FSDP_CHECK_ARG(output.device() == input.device(), "reduce_scatter: output on {} but input on {}",
                 output.device().str(), input.device().str());
  FSDP_CHECK_ARG(
      input.numel() == size_ * output.numel(),
      "reduce_scatter: input numel must be world size x output numel = {} x {} = {}, got {}", size_,
      output.numel(), size_ * output.numel(), input.numel());
  FSDP_CHECK_ARG(op != ReduceOp::kAvg || is_floating(input.scalar_type()),
                 "reduce_scatter: ReduceOp::kAvg needs a floating dtype, got {}",
                 c10::toString(input.scalar_type()));
  FSDP_CHECK_ARG(!overlaps(output, input), "reduce_scatter: output and input must not overlap");
  check_in_sync(CollectiveKind::kReduceScatter, input.numel(), input.scalar_type(),
                static_cast<int64_t>(op));
  count(CollectiveKind::kReduceScatter, input);
  if (answers_locally()) {
    at::NoGradGuard no_grad;
    output.copy_(input);  // the sum, or the average, of one
    return completed();
  }
  return do_reduce_scatter(output, input, op);
}

WorkPtr ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  check_tensor("all_reduce", "tensor", tensor);
  FSDP_CHECK_ARG(op != ReduceOp::kAvg || is_floating(tensor.scalar_type()),
                 "all_reduce: ReduceOp::kAvg needs a floating dtype, got {}",
                 c10::toString(tensor.scalar_type()));
  check_in_sync(CollectiveKind::kAllReduce, tensor.numel(), tensor.scalar_type(),
                static_cast<int64_t>(op));
  count(CollectiveKind::kAllReduce, tensor);
  if (answers_locally()) return completed();
  return do_all_reduce(tensor, op);
}

WorkPtr ProcessGroup::broadcast(const at::Tensor& tensor, int root) {
  check_tensor("broadcast", "tensor", tensor);
  FSDP_CHECK_ARG(root >= 0 && root < size_, "broadcast: root must be in [0, {}), got {}", size_,
                 root);
  check_in_sync(CollectiveKind::kBroadcast, tensor.numel(), tensor.scalar_type(), root);
  count(CollectiveKind::kBroadcast, tensor);
  if (answers_locally()) return completed();
  return do_broadcast(tensor, root);
}

WorkPtr ProcessGroup::barrier() {
  check_in_sync(CollectiveKind::kBarrier, 0, at::kByte, -1);
  count(CollectiveKind::kBarrier, at::Tensor());
  if (answers_locally()) return completed();
  return do_barrier();
}

void ProcessGroup::check_in_sync(CollectiveKind kind, int64_t numel, at::ScalarType dtype,
                                 int64_t detail) {
  const int64_t seq = issued_++;
  if (!desync_check_ || size_ == 1 || backend() == Backend::kFake) return;
  constexpr int kFields = 5;
  const int64_t mine[kFields] = {seq, static_cast<int64_t>(kind), numel,
                                 static_cast<int64_t>(dtype), detail};
  auto opts = at::TensorOptions().dtype(at::kLong).device(device());
  auto in = at::from_blob(const_cast<int64_t*>(mine), {kFields}, at::kLong).clone().to(opts);
  auto all = at::empty({size_ * kFields}, opts);
  // Straight to the backend: the fingerprint exchange is neither counted nor itself checked.
  // Its size is the same on every rank, so it cannot desynchronise.
  do_all_gather(all, in)->wait();
  auto cpu = all.cpu();
  const int64_t* f = cpu.data_ptr<int64_t>();
  // Ranks grouped by identical fingerprints, in rank order: one group means all agree.
  std::vector<std::pair<std::vector<int64_t>, std::vector<int>>> groups;
  for (int r = 0; r < size_; ++r) {
    std::vector<int64_t> fp(f + r * kFields, f + (r + 1) * kFields);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == fp; });
    if (it == groups.end()) {
      groups.push_back({fp, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (groups.size() == 1) return;
  auto describe = [](const std::vector<int64_t>& fp) {
    const auto k = static_cast<CollectiveKind>(fp[1]);
    std::string what = fmt::format("collective #{}: {}", fp[0], collective_name(k));
    if (k != CollectiveKind::kBarrier) {
      what += fmt::format(" of {} {} elements", fp[2],
                          c10::toString(static_cast<at::ScalarType>(fp[3])));
    }
    if (k == CollectiveKind::kBroadcast) what += fmt::format(" from root {}", fp[4]);
    if (k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter) {
      what += fmt::format(" ({})", fp[4] == static_cast<int64_t>(ReduceOp::kAvg) ? "avg" : "sum");
    }
    return what;
  };
  std::string message = fmt::format(
      "desynchronised collectives (FSDP_DEBUG_DESYNC): the ranks issued different collectives "
      "as this group's collective #{} (rank 0's count):",
      f[0]);
  for (const auto& [fp, ranks] : groups) {
    message += fmt::format(" rank{} {} issued {};", ranks.size() > 1 ? "s" : "",
                           fmt::join(ranks, ","), describe(fp));
  }
  message.pop_back();
  message +=
      ". Every rank must issue the same collectives in the same order (same modules run, same "
      "units called, same parameters requiring gradients)";
  throw CommError(backend_name(), "desync check", rank_, size_, message);
}

std::vector<int> ProcessGroup::gather_colors(int color, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kInt).device(device);
  auto mine = at::full({1}, color, opts);
  auto all = at::empty({size_}, opts);
  all_gather(all, mine)->wait();
  auto cpu = all.cpu();
  return std::vector<int>(cpu.data_ptr<int>(), cpu.data_ptr<int>() + size_);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color) {
  FSDP_CHECK_ARG(color >= 0, "split: color must be >= 0, got {}", color);
  auto colors = gather_colors(color, device());
  std::vector<int> members;
  int index = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) index = static_cast<int>(members.size());
    if (colors[r] == color) members.push_back(r);
  }
  return do_split(color, members, index);
}

namespace {
[[noreturn]] void unsupported(const ProcessGroup& pg, const char* op) {
  throw UnsupportedError(fmt::format("backend {} does not support {}", pg.backend_name(), op));
}
}  // namespace

WorkPtr ProcessGroup::do_all_gather(const at::Tensor&, const at::Tensor&) {
  unsupported(*this, "all_gather");
}
WorkPtr ProcessGroup::do_reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) {
  unsupported(*this, "reduce_scatter");
}
WorkPtr ProcessGroup::do_all_reduce(const at::Tensor&, ReduceOp) {
  unsupported(*this, "all_reduce");
}
WorkPtr ProcessGroup::do_broadcast(const at::Tensor&, int) { unsupported(*this, "broadcast"); }
WorkPtr ProcessGroup::do_barrier() { unsupported(*this, "barrier"); }
std::shared_ptr<ProcessGroup> ProcessGroup::do_split(int, const std::vector<int>&, int) {
  unsupported(*this, "split");
}

}  // namespace fsdp
