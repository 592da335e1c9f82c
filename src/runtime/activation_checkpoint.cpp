// Activation checkpointing of one unit's forward (FullyShardOptions::activation_checkpointing).
//
// The forward runs inside a custom autograd function, so it records no graph and keeps only
// its inputs; backward recomputes it, with the random-number state of the first run, and
// backpropagates through the recomputed graph (a reentrant backward, as
// torch.utils.checkpoint with use_reentrant=True: libtorch offers C++ callers no saved-tensor
// hooks, which the non-reentrant variant needs).
//
// Composition with FSDP: the gradient reaching the outputs runs the unit's pre-backward (a
// hook on the outputs), which gathers the parameters before the recompute; the recompute arms
// the gradient hooks on the gathered parameters, so the unit's post-backward and reduce-scatter
// run as they do without checkpointing. Units called inside the recomputed forward gather their
// parameters for the backward that follows at once and leave the forward order alone
// (UnitState::pre_forward).
#include "runtime/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <utility>

#include "fsdp/errors.h"
#include "runtime/unit_state.h"
#include "util/profiler_range.h"

namespace fsdp::detail {
namespace {

// The states of the generators a forward may draw from: the CPU generator, and the default
// generator of the inputs' accelerator if they live on one.
class RngStates {
 public:
  static RngStates capture(const std::vector<at::Tensor>& inputs) {
    RngStates s;
    s.add(at::detail::getDefaultCPUGenerator());
    for (const auto& t : inputs) {
      if (t.defined() && !t.is_cpu()) {
        s.add(at::globalContext().defaultGenerator(t.device()));
        break;
      }
    }
    return s;
  }
  // The current states of the same generators.
  RngStates now() const {
    RngStates s;
    for (const auto& e : entries_) s.add(e.first);
    return s;
  }
  void restore() const {
    for (const auto& [gen, state] : entries_) {
      at::Generator g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(state);
    }
  }

 private:
  void add(at::Generator gen) {
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    entries_.emplace_back(std::move(gen), std::move(state));
  }
  std::vector<std::pair<at::Generator, at::Tensor>> entries_;
};

// What the backward needs besides the saved inputs; lives in the node's context.
struct Recompute : torch::CustomClassHolder {
  std::weak_ptr<UnitState> state;
  ForwardFn forward;
  RngStates rng;
  std::vector<bool> input_requires_grad;
};

// Runs a recompute between the unit's begin_recompute and end_recompute, with the generators
// set to the first run's states and put back afterwards.
std::vector<at::Tensor> recompute(UnitState& state, const Recompute& r,
                                  const std::vector<at::Tensor>& inputs) {
  FSDP_RANGE("fsdp::recompute");
  RngStates current = r.rng.now();
  state.begin_recompute();
  r.rng.restore();
  try {
    at::AutoGradMode enable_grad(true);
    auto outputs = r.forward(inputs);
    state.end_recompute();
    current.restore();
    return outputs;
  } catch (...) {
    state.end_recompute();
    current.restore();
    throw;
  }
}

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // `inputs`: the forward's tensor arguments, then an anchor that requires grad, so that the
  // node is in the graph (and the parameters get gradients) even when no input requires grad.
  // A TensorList, not a vector: autograd counts only Tensors and TensorLists as inputs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList with_anchor,
                                                c10::intrusive_ptr<Recompute> r) {
    std::vector<at::Tensor> inputs(with_anchor.begin(), with_anchor.end() - 1);
    for (const auto& t : inputs) r->input_requires_grad.push_back(t.defined() && t.requires_grad());
    r->rng = RngStates::capture(inputs);
    ctx->save_for_backward(inputs);
    // Autograd runs this without grad mode: nothing inside records a graph.
    auto outputs = r->forward(inputs);
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(r);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto r =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    auto state = r->state.lock();
    if (!state) {
      throw InvalidArgument(
          "fsdp: a checkpointed unit was destroyed before the backward of its forward");
    }
    auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor x = saved[i].defined() ? saved[i].detach() : at::Tensor();
      if (x.defined() && r->input_requires_grad[i]) x.requires_grad_(true);
      inputs.push_back(std::move(x));
    }
    auto outputs = recompute(*state, *r, inputs);
    torch::autograd::variable_list roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // Accumulates into the parameters (their hooks run the unit's post-backward) and into the
    // detached inputs, whose gradients are this node's.
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    torch::autograd::variable_list result;
    for (const auto& x : inputs) {
      result.push_back(x.defined() && x.requires_grad() ? x.grad() : at::Tensor());
    }
    result.emplace_back();  // the anchor
    result.emplace_back();  // the Recompute argument
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> run_checkpointed(UnitState& state, const std::vector<at::Tensor>& inputs,
                                         const ForwardFn& forward) {
  auto r = c10::make_intrusive<Recompute>();
  r->state = state.weak_from_this();
  r->forward = forward;
  torch::autograd::variable_list args = inputs;
  auto anchor_options = at::TensorOptions().dtype(at::kFloat);
  if (!inputs.empty() && inputs.front().defined())
    anchor_options = anchor_options.device(inputs.front().device());
  args.push_back(at::empty({0}, anchor_options).requires_grad_(true));
  return CheckpointFunction::apply(at::TensorList(args), std::move(r));
}

}  // namespace fsdp::detail
