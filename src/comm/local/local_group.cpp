// The "local" backend: N ranks as N threads sharing memory. Each collective is a rendezvous:
// every rank posts its tensors, waits for all (phase A), computes its own result by reading
// the peers' inputs, then waits again (phase B) so no rank reuses an input a peer still reads.
#include "fsdp/comm/local_group.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "comm/detail/op_queue.h"
#include "comm/detail/reduce_util.h"
#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp {
namespace {

struct Post {
  CollectiveKind kind = CollectiveKind::kBarrier;
  at::Tensor input;   // read by peers
  at::Tensor output;  // written by its owner only
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  int root = 0;
};

// State shared by the ranks of one local world.
class LocalWorld {
 public:
  LocalWorld(int size, LocalGroupOptions options) : size_(size), options_(options), posts_(size) {}

  int size() const { return size_; }
  const LocalGroupOptions& options() const { return options_; }
  std::vector<Post>& posts() { return posts_; }

  // Blocks until all ranks arrive or the timeout passes (TimeoutError). A timeout breaks the
  // world: later collectives fail at once instead of waiting again.
  void arrive(int rank, const char* op) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) throw_broken(rank, op);
    uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, options_.timeout, [&] { return generation_ != gen || broken_; })) {
      broken_ = true;
      cv_.notify_all();
      throw TimeoutError("local", op, rank, size_,
                         fmt::format("peers did not arrive within {} ms (a rank died, is stuck, "
                                     "or issued a different sequence of collectives)",
                                     options_.timeout.count()));
    }
    if (generation_ == gen) throw_broken(rank, op);
  }

  // The k-th split of this world by `color`: created by the first member that asks, handed to
  // the others, forgotten once every member has taken it.
  std::shared_ptr<LocalWorld> child(int64_t seq, int color, int members) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(seq, color);
    auto it = children_.find(key);
    if (it == children_.end()) {
      it = children_.emplace(key, Child{std::make_shared<LocalWorld>(members, options_), 0}).first;
    }
    auto world = it->second.world;
    if (++it->second.taken == members) children_.erase(it);
    return world;
  }

 private:
  [[noreturn]] void throw_broken(int rank, const char* op) {
    throw CommError("local", op, rank, size_, "an earlier collective of this group timed out");
  }

  struct Child {
    std::shared_ptr<LocalWorld> world;
    int taken;
  };
  const int size_;
  const LocalGroupOptions options_;
  std::vector<Post> posts_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  std::map<std::pair<int64_t, int>, Child> children_;
};

class LocalProcessGroup final : public ProcessGroup {
 public:
  LocalProcessGroup(int rank, std::shared_ptr<LocalWorld> world)
      : ProcessGroup(rank, world->size()), world_(std::move(world)) {}

  Backend backend() const override { return Backend::kLocal; }
  at::DeviceType device_type() const override { return at::kCPU; }

 protected:
  WorkPtr do_all_gather(const at::Tensor& output, const at::Tensor& input) override {
    return queue_.submit("fsdp::comm::all_gather", output.nbytes(), [=] {
      rendezvous(CollectiveKind::kAllGather, input, output, /*root=*/0, [&](auto& posts) {
        auto n = input.numel();
        auto flat = output.view(-1);
        for (int r = 0; r < size(); ++r) flat.narrow(0, r * n, n).copy_(posts[r].input.view(-1));
      });
    });
  }

  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op) override {
    return queue_.submit("fsdp::comm::reduce_scatter", input.nbytes(), [=] {
      rendezvous(CollectiveKind::kReduceScatter, input, output, /*root=*/0, [&](auto& posts) {
        auto n = output.numel();
        auto sum = sum_slices(posts, rank() * n, n);
        detail::finish_reduction(output.view(-1), sum, op, size());
      });
    });
  }

  WorkPtr do_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return queue_.submit("fsdp::comm::all_reduce", tensor.nbytes(), [=] {
      at::Tensor sum;
      // In place: peers read `tensor` until phase B, so the result is stored after it.
      rendezvous(CollectiveKind::kAllReduce, tensor, tensor, /*root=*/0,
                 [&](auto& posts) { sum = sum_slices(posts, 0, tensor.numel()); });
      detail::finish_reduction(tensor.view(-1), sum, op, size());
    });
  }

  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override {
    return queue_.submit("fsdp::comm::broadcast", tensor.nbytes(), [=] {
      at::Tensor copy;
      rendezvous(CollectiveKind::kBroadcast, tensor, tensor, root, [&](auto& posts) {
        if (rank() != root) copy = posts[root].input.clone();
      });
      if (copy.defined()) tensor.copy_(copy);
    });
  }

  WorkPtr do_barrier() override {
    return queue_.submit("fsdp::comm::barrier", 0, [=] {
      rendezvous(CollectiveKind::kBarrier, at::Tensor(), at::Tensor(), 0, [](auto&) {});
    });
  }

  std::shared_ptr<ProcessGroup> do_split(int color, const std::vector<int>& members,
                                         int index) override {
    auto child = world_->child(split_count_++, color, static_cast<int>(members.size()));
    return std::make_shared<LocalProcessGroup>(index, child);
  }

 private:
  // Sum over ranks of input[offset, offset + n), in float32 for 16-bit floats, in rank order
  // (deterministic).
  at::Tensor sum_slices(std::vector<Post>& posts, int64_t offset, int64_t n) {
    return detail::sum_in_rank_order(
        size(), [&](int r) { return posts[r].input.view(-1).narrow(0, offset, n); });
  }

  template <typename Compute>
  void rendezvous(CollectiveKind kind, const at::Tensor& input, const at::Tensor& output, int root,
                  Compute compute) {
    const char* op = collective_name(kind);
    auto& posts = world_->posts();
    posts[rank()] = Post{kind,
                         input,
                         output,
                         input.defined() ? input.numel() : 0,
                         input.defined() ? input.scalar_type() : at::kFloat,
                         root};
    world_->arrive(rank(), op);  // phase A: every input is posted
    std::exception_ptr error;
    try {
      check_peers_match(posts, op);
      compute(posts);
    } catch (...) {
      error = std::current_exception();
    }
    world_->arrive(rank(), op);  // phase B: nobody reads peers' inputs any more
    posts[rank()] = Post{};
    if (error) std::rethrow_exception(error);
  }

  void check_peers_match(const std::vector<Post>& posts, const char* op) const {
    const Post& mine = posts[rank()];
    for (int r = 0; r < size(); ++r) {
      const Post& p = posts[r];
      if (p.kind != mine.kind || p.numel != mine.numel || p.dtype != mine.dtype ||
          p.root != mine.root) {
        throw CommError("local", op, rank(), size(),
                        fmt::format("rank {} issued {} (numel {}, dtype {}) while this rank "
                                    "issued {} (numel {}, dtype {})",
                                    r, collective_name(p.kind), p.numel, c10::toString(p.dtype), op,
                                    mine.numel, c10::toString(mine.dtype)));
      }
    }
  }

  std::shared_ptr<LocalWorld> world_;
  int64_t split_count_ = 0;
  detail::OpQueue queue_;  // declared last: joined first, while world_ is still alive
};

}  // namespace

std::vector<ProcessGroupPtr> make_local_groups(int world_size, LocalGroupOptions options) {
  FSDP_CHECK_ARG(world_size >= 1, "make_local_groups: world_size must be >= 1, got {}", world_size);
  auto world = std::make_shared<LocalWorld>(world_size, options);
  std::vector<ProcessGroupPtr> groups;
  for (int r = 0; r < world_size; ++r) {
    groups.push_back(std::make_shared<LocalProcessGroup>(r, world));
  }
  return groups;
}

void run_local_ranks(int world_size, const std::function<void(const ProcessGroupPtr&)>& body,
                     LocalGroupOptions options) {
  auto groups = make_local_groups(world_size, options);
  // The first error in time is the cause; peers' later errors are usually its echo (timeouts).
  std::mutex mu;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(groups[r]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace fsdp
