// The training programs of the runtime's edge cases (issue: FSDP2's module API correct at its
// edges), shared by the thread-rank tests and the MPI ones: each runs unsharded in one process
// and sharded, and the two must agree. Every program is what a user writes without FSDP.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/edge_model.h"

namespace fsdp::testing {

// fp32 runs whose sums are reordered by the average over ranks (and by accumulation).
inline constexpr double kEdgeTolerance = 1e-5;

// --- zero_grad anywhere in the step -------------------------------------------------------------

enum class ZeroGradAt { kBeforeForward, kBetweenForwardAndBackward, kAfterStep, kInPlaceBetween };

inline const char* zero_grad_name(ZeroGradAt at) {
  switch (at) {
    case ZeroGradAt::kBeforeForward:
      return "before_forward";
    case ZeroGradAt::kBetweenForwardAndBackward:
      return "between_forward_and_backward";
    case ZeroGradAt::kAfterStep:
      return "after_step";
    case ZeroGradAt::kInPlaceBetween:
      return "in_place_between";
  }
  return "?";
}

inline EdgeProgram zero_grad_program(ZeroGradAt at, bool set_to_none) {
  return [=](EdgeStep& s) {
    if (at == ZeroGradAt::kBeforeForward) s.opt.zero_grad(set_to_none);
    auto loss = s.loss();
    if (at == ZeroGradAt::kBetweenForwardAndBackward) s.opt.zero_grad(set_to_none);
    if (at == ZeroGradAt::kInPlaceBetween) {
      torch::NoGradGuard no_grad;
      for (auto& p : s.net.parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
    loss.backward();
    s.opt.step();
    if (at == ZeroGradAt::kAfterStep) s.opt.zero_grad(set_to_none);
  };
}

// --- requires_grad changing
// -----------------------------------------------------------------------

// Sets requires_grad of the parameters whose names start with any of `prefixes`.
inline void set_trainable(EdgeNetImpl& net, const std::vector<std::string>& prefixes, bool on) {
  for (const auto& p : net.named_parameters()) {
    for (const auto& prefix : prefixes) {
      if (p.key().rfind(prefix, 0) == 0) p.value().set_requires_grad(on);
    }
  }
}

// Freezes `frozen` (by name prefix) from step `from` to step `to` (exclusive), with
// `micro_batches` micro-batches per step (gradient sync off for all but the last).
inline EdgeProgram freeze_program(std::vector<std::string> frozen, int from, int to,
                                  int micro_batches = 1) {
  return [=](EdgeStep& s) {
    if (s.step == from) set_trainable(s.net, frozen, false);
    if (s.step == to) set_trainable(s.net, frozen, true);
    s.opt.zero_grad();
    for (int k = 0; k < micro_batches; ++k) {
      if (s.root) s.root->set_requires_gradient_sync(k + 1 == micro_batches);
      s.loss_part(k, micro_batches).backward();
    }
    s.opt.step();
  };
}

// --- failures
// ---------------------------------------------------------------------------------------

enum class Failure { kInnerForward, kRootForward, kBackwardHook, kSkippedBackward };

inline const char* failure_name(Failure f) {
  switch (f) {
    case Failure::kInnerForward:
      return "inner_forward";
    case Failure::kRootForward:
      return "root_forward";
    case Failure::kBackwardHook:
      return "backward_hook";
    case Failure::kSkippedBackward:
      return "skipped_backward";
  }
  return "?";
}

// At step `at` the step fails as `f` says; the program catches the error, zeroes the gradients
// and goes on, as a training loop that survives a bad batch does. After the failure the tree
// must hold nothing gathered and no buffer in flight (`clean` turns false otherwise).
inline EdgeProgram failure_program(Failure f, int at, std::shared_ptr<Probe> probe,
                                   std::shared_ptr<bool> clean, int blocks) {
  return [=](EdgeStep& s) {
    s.opt.zero_grad();
    if (s.step != at) {
      s.loss().backward();
      s.opt.step();
      return;
    }
    try {
      if (f == Failure::kInnerForward) probe->throw_in_forward = 1;
      if (f == Failure::kRootForward) probe->throw_in_forward = blocks;
      if (f == Failure::kBackwardHook) probe->throw_in_backward = 1;
      auto loss = s.loss();
      if (f != Failure::kSkippedBackward) loss.backward();
    } catch (const std::runtime_error& e) {
      // The model's own error, not the runtime's.
      if (std::string(e.what()).find("failed in") == std::string::npos) *clean = false;
    }
    probe->throw_in_forward = probe->throw_in_backward = -1;
    s.opt.zero_grad();
    if (s.root && f != Failure::kSkippedBackward) {
      const auto m = s.root->memory_stats();
      if (m.tree.full_param_bytes != 0 || m.tree.comm_buffer_bytes != 0) *clean = false;
    }
  };
}

// --- running both
// ------------------------------------------------------------------------------------

// The unsharded result of `program` (computed once per process).
inline EdgeResult reference_of(const EdgeSpec& spec, const EdgeProgram& program,
                               std::shared_ptr<Probe> probe = nullptr) {
  return run_edge(spec, nullptr, program, probe);
}

// Expects the sharded run over `mesh` (this rank's part) to match `want`.
inline void expect_edge_parity(const std::string& label, const EdgeSpec& spec,
                               const DeviceMesh& mesh, const EdgeProgram& program,
                               const EdgeResult& want, std::shared_ptr<Probe> probe = nullptr,
                               double tolerance = kEdgeTolerance) {
  auto got = run_edge(spec, &mesh, program, probe);
  const double err = max_rel_error(got, want);
  if (mesh.world->rank() == 0) {
    std::cout << label << " world " << mesh.world->size() << ": max rel error " << err << "\n";
  }
  EXPECT_LT(err, tolerance) << label << " world " << mesh.world->size();
}

}  // namespace fsdp::testing
