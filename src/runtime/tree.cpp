#include "runtime/tree.h"

#include <torch/csrc/autograd/engine.h>

#include <algorithm>

#include "fsdp/runtime/layout.h"
#include "runtime/reduce.h"
#include "runtime/unit_state.h"
#include "util/check.h"
#include "util/profiler_range.h"

namespace fsdp::detail {

// FSDP2's _lazy_init / _init_shared_state: the root collects its tree, checks it, and hands
// every unit this tree.
void Tree::init(UnitState& root) {
  std::vector<UnitState*> tree{&root};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (const auto& c : tree[i]->children()) tree.push_back(c.get());
  }
  const int world = root.group().pg()->size();
  for (UnitState* s : tree) {
    FSDP_CHECK_ARG(s->group().pg()->size() == world,
                   "fsdp: units of one root must share a world size: the root's group has {} "
                   "ranks, {} has {}",
                   world, s->describe(), s->group().pg()->size());
  }
  // A tensor two units shard (a tied weight in two sibling units) corrupts both shards: caught
  // here for units fully_shard could not compare (neither inside the other).
  std::vector<std::pair<const c10::TensorImpl*, UnitState*>> owners;
  for (UnitState* s : tree) {
    for (const auto& p : s->group().params())
      owners.emplace_back(p.param().unsafeGetTensorImpl(), s);
  }
  std::sort(owners.begin(), owners.end());
  for (size_t i = 1; i < owners.size(); ++i) {
    FSDP_CHECK_ARG(owners[i].first != owners[i - 1].first,
                   "fsdp: {} and {} shard the same tensor (a weight tied between two units); keep "
                   "the modules that share it in one unit",
                   owners[i - 1].second->describe(), owners[i].second->describe());
  }
  units_ = tree;
  auto self = shared_from_this();
  for (UnitState* s : tree) s->join(self);
  // Names for messages and profiler ranges: each unit's module path in the root.
  // A unit of several modules is named by its members' paths joined with '+'.
  if (auto module = root.module()) {
    std::vector<std::string> names(tree.size());
    for (const auto& item : module->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      for (size_t i = 0; i < tree.size(); ++i) {
        if (!tree[i]->has_module(item.value().get())) continue;
        names[i] += (names[i].empty() ? "" : "+") + (item.key().empty() ? "(root)" : item.key());
      }
    }
    for (size_t i = 0; i < tree.size(); ++i) {
      if (!names[i].empty()) tree[i]->set_name(names[i]);
    }
  }
  initialised_ = true;
}

void Tree::begin_forward() {
  recover_if_stale();
  forward_order_.clear();
  post_forward_order_.clear();
}

void Tree::record_pre_forward(UnitState* unit) { forward_order_.push_back(unit); }

UnitState* Tree::forward_successor(const UnitState* unit) const {
  // The unit at the same position of the last complete step's order, one ahead.
  const size_t pos = forward_order_.size();
  if (pos >= last_forward_order_.size()) return nullptr;
  UnitState* next = last_forward_order_[pos];
  return next == unit ? nullptr : next;
}

bool Tree::ran_this_forward(const UnitState* unit) const {
  return std::find(forward_order_.begin(), forward_order_.end(), unit) != forward_order_.end();
}

int Tree::record_post_forward(UnitState* unit) {
  post_forward_order_.push_back(unit);
  return static_cast<int>(post_forward_order_.size()) - 1;
}

UnitState* Tree::post_forward_predecessor(int index) const {
  if (index <= 0 || index > static_cast<int>(post_forward_order_.size())) return nullptr;
  return post_forward_order_[index - 1];
}

void Tree::end_forward(bool grad_mode) {
  last_forward_order_ = forward_order_;
  if (grad_mode && phase_ == Phase::kIdle) phase_ = Phase::kForward;
}

void Tree::note_output(const at::Tensor& output) {
  if (auto fn = output.grad_fn()) outputs_.push_back(fn);
}

void Tree::on_backward_hook() {
  if (phase_ == Phase::kBackward && !callback_token_.expired()) return;
  if (phase_ == Phase::kBackward) reset();  // a backward that threw before this one
  phase_ = Phase::kBackward;
  auto token = std::make_shared<int>(0);
  callback_token_ = token;
  std::weak_ptr<Tree> self = weak_from_this();
  // Whichever unit's hook queues it, the callback finishes the whole tree. The graph task owns
  // the callback (and the token): if the backward throws, both die without the callback.
  torch::autograd::Engine::get_default_engine().queue_callback([self, token] {
    if (auto tree = self.lock()) tree->end_backward();
  });
}

bool Tree::backward_running() const {
  return phase_ == Phase::kBackward && !callback_token_.expired();
}

void Tree::end_backward() {
  FSDP_RANGE("fsdp::end_of_backward");
  // Same order on every rank (tree order): units whose gradients were incomplete (unused or
  // frozen parameters) reduce what they have, then every reduction is waited for.
  for (UnitState* s : units_) s->group().tree_backward_ended();
  if (is_last_backward) finish_reductions(*comm_);
  for (UnitState* s : units_) s->end_backward();
  phase_ = Phase::kIdle;
  outputs_.clear();
  callback_token_.reset();
}

bool Tree::stale() const {
  if (phase_ == Phase::kBackward) return callback_token_.expired();
  if (phase_ == Phase::kForward) {
    return std::all_of(outputs_.begin(), outputs_.end(), [](const auto& o) { return o.expired(); });
  }
  return false;
}

void Tree::recover_if_stale() {
  if (stale()) reset();
}

void Tree::reset() {
  FSDP_RANGE("fsdp::reset");
  // Reductions already issued land (every rank issued them); gradients not yet reduced are
  // this failed step's and go.
  finish_reductions(*comm_);
  for (UnitState* s : units_) s->reset_step();
  phase_ = Phase::kIdle;
  forward_order_.clear();
  post_forward_order_.clear();
  outputs_.clear();
  callback_token_.reset();
  recompute_depth_ = 0;
}

}  // namespace fsdp::detail
