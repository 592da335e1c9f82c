// ProcessGroup: the small collective interface that FSDP needs, on flat contiguous tensors.
//
// Every rank of a group must issue the same collectives in the same order with matching
// sizes and dtypes. Each collective is asynchronous and returns a Work handle; its tensors
// must stay alive and untouched until wait() returns (backends also keep them alive
// internally). Arguments are checked once here, before any backend sees them; a violation
// throws fsdp::InvalidArgument naming the operation, the tensor and what was expected.
//
// Supported dtypes: float32, float64, bfloat16, float16 (all operations), int32, int64, uint8
// (all but ReduceOp::kAvg). Reductions of bfloat16/float16 accumulate in float32 on the CPU
// backends, so that a sum over ranks is as accurate as the engine's float32 sum. NCCL reduces
// them in their own dtype, as c10d and FSDP2 do: the bytes moved are the tensor's (what
// stats() counts), and NCCL rounds at each step of its ring.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/work.h"

namespace fsdp {

enum class ReduceOp { kSum, kAvg };

// The engines: MPI, NCCL, Gloo (through libtorch's c10d), thread ranks in one process, and a
// fake group that plays one rank of a larger world (tests).
enum class Backend { kMpi, kNccl, kGloo, kLocal, kFake };
// "mpi", "nccl", "gloo", "local", "fake".
const char* backend_name(Backend backend);

// The operations a group counts; index into CollectiveStats arrays.
enum class CollectiveKind : int {
  kAllGather = 0,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier
};
inline constexpr int kNumCollectiveKinds = 5;
const char* collective_name(CollectiveKind kind);

// How many collectives a group issued and how many input bytes each kind moved, per rank.
struct CollectiveStats {
  std::array<int64_t, kNumCollectiveKinds> calls{};
  std::array<int64_t, kNumCollectiveKinds> bytes{};
  int64_t count(CollectiveKind kind) const { return calls[static_cast<int>(kind)]; }
  int64_t bytes_of(CollectiveKind kind) const { return bytes[static_cast<int>(kind)]; }
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  ProcessGroup(int rank, int size);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual Backend backend() const = 0;
  std::string backend_name() const { return fsdp::backend_name(backend()); }
  // Where this group's tensors live: at::kCPU or at::kCUDA.
  virtual at::DeviceType device_type() const = 0;
  // The device of this group's tensors: its type, and for NCCL the rank's GPU.
  virtual at::Device device() const { return at::Device(device_type()); }

  // Every collective is validated and counted here. A group of one rank never calls its
  // engine: the result is a local copy (on CUDA, on the caller's current stream) and the Work
  // is complete at once. (NCCL's ncclAvg on one rank left the last elements unprocessed in
  // 2.27 to 2.29.6, NVIDIA/nccl issue 1950; FSDP2 and c10d avoid NCCL there too.) Tests of an
  // engine itself on one device turn that off (set_one_rank_through_engine).

  // output.numel() == size() * input.numel(); rank r's input lands in
  // output[r * input.numel(), (r + 1) * input.numel()). output must not overlap input.
  WorkPtr all_gather(const at::Tensor& output, const at::Tensor& input);

  // input.numel() == size() * output.numel(); output receives the reduction over ranks of
  // input[rank * output.numel(), (rank + 1) * output.numel()). kAvg divides by size().
  WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op);

  // In place: tensor receives the reduction over ranks of tensor.
  WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op);

  // In place: every rank's tensor receives root's tensor.
  WorkPtr broadcast(const at::Tensor& tensor, int root);

  WorkPtr barrier();

  // Collective over this group, like MPI_Comm_split: ranks that pass the same color form a new
  // group, ordered by their rank here. Used for hybrid sharding (shard and replicate groups).
  std::shared_ptr<ProcessGroup> split(int color);

  // For tests of an engine itself (one GPU: its watchdog, streams, fault reports): one-rank
  // collectives reach the engine instead of being answered locally. Off by default.
  void set_one_rank_through_engine(bool on) { one_rank_through_engine_ = on; }

  const CollectiveStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CollectiveStats{}; }

  // Desync detection (like TORCH_DISTRIBUTED_DEBUG=DETAIL): before each collective the ranks
  // exchange its fingerprint (this group's sequence number, the operation, element count,
  // dtype, reduce op or root) with one small all-gather, and on any difference every rank
  // throws the same CommError naming the first divergent collective and which ranks issued
  // what, instead of hanging or mixing unrelated data. Off by default; the environment
  // variable FSDP_DEBUG_DESYNC=1 turns it on for every group created afterwards. It costs one
  // blocking round trip per collective. Collectives of the same kind, size and dtype issued
  // for different purposes are indistinguishable (as in c10d). The fake backend ignores it.
  void set_desync_check(bool on) { desync_check_ = on; }
  bool desync_check() const { return desync_check_; }

 protected:
  bool answers_locally() const { return size_ == 1 && !one_rank_through_engine_; }
  // Backends implement these; arguments are already validated. The defaults throw
  // UnsupportedError("backend X does not support Y").
  virtual WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input);
  virtual WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op);
  virtual WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op);
  virtual WorkPtr do_broadcast(const at::Tensor& tensor, int root);
  virtual WorkPtr do_barrier();
  // members: ranks of this group (ascending) that passed `color`; this rank is
  // members[index], its rank in the new group.
  virtual std::shared_ptr<ProcessGroup> do_split(int color, const std::vector<int>& members,
                                                 int index);

 private:
  void check_tensor(const char* op, const char* name, const at::Tensor& t) const;
  // Every rank's color, by an all_gather on `device`.
  std::vector<int> gather_colors(int color, const at::Device& device);
  void count(CollectiveKind kind, const at::Tensor& t);
  // The desync check before a collective (see set_desync_check): `numel` and `dtype` describe
  // its input, `detail` the reduce op or broadcast root (-1 when none).
  void check_in_sync(CollectiveKind kind, int64_t numel, at::ScalarType dtype, int64_t detail);

  int rank_;
  int size_;
  CollectiveStats stats_;
  bool one_rank_through_engine_ = false;
  int64_t issued_ = 0;  // collectives issued through the public calls: the desync sequence
  bool desync_check_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace fsdp
