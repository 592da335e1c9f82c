// A unit's lifecycle as FSDPModule::training_state() and sharded_state() report it (FSDP2's
// TrainingState and ShardedState, fsdp/runtime/lifecycle.h) at every point of a step, and the
// switches that change it; the switches refused while a backward runs; the gradient divide
// factor at world 1.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/edge_model.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

at::Tensor edge_logits(Unit<EdgeNet>& root, const EdgeSpec& spec, const ProcessGroupPtr& pg,
                       int step) {
  auto [x, y] = edge_batch(spec, step);
  const int64_t local = spec.batch / pg->size();
  return root(rank_slice(x, pg, local));
}

at::Tensor edge_loss(const at::Tensor& logits, const EdgeSpec& spec, const ProcessGroupPtr& pg,
                     int step) {
  auto [x, y] = edge_batch(spec, step);
  const int64_t local = spec.batch / pg->size();
  return torch::nn::functional::cross_entropy(logits, rank_slice(y, pg, local));
}

struct Seen {
  TrainingState training;
  ShardedState sharded;
};

Seen seen(const FSDPModule& m) { return {m.training_state(), m.sharded_state()}; }

void expect_state(const FSDPModule& m, TrainingState t, ShardedState s, const std::string& where) {
  EXPECT_EQ(to_string(m.training_state()), std::string(to_string(t))) << where;
  EXPECT_EQ(to_string(m.sharded_state()), std::string(to_string(s))) << where;
}

// Through one step: idle and sharded before; the running block and the root in kForward with
// their parameters unsharded inside the forward; after it the root keeps its parameters (FSDP2's
// root default), the blocks freed them; the root's backward starts in kPreBackward; everything
// idle and sharded after the backward.
TEST(Lifecycle, StatesThroughOneStep) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto probe = std::make_shared<Probe>();
        auto net = build_edge_net(spec, probe);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        expect_state(root, TrainingState::kIdle, ShardedState::kSharded, "root before");
        for (auto& b : net->blocks) {
          expect_state(b, TrainingState::kIdle, ShardedState::kSharded, "block before");
        }
        std::vector<Seen> in_block, root_in_block;
        probe->on_forward = [&](int i, const at::Tensor&) {
          in_block.push_back(seen(net->blocks[i]));
          root_in_block.push_back(seen(root));
        };
        auto logits = edge_logits(root, spec, pg, 0);
        ASSERT_EQ(in_block.size(), static_cast<size_t>(spec.blocks));
        for (size_t i = 0; i < in_block.size(); ++i) {
          EXPECT_EQ(in_block[i].training, TrainingState::kForward) << "block " << i;
          EXPECT_EQ(in_block[i].sharded, ShardedState::kUnsharded) << "block " << i;
          EXPECT_EQ(root_in_block[i].training, TrainingState::kForward) << "root, block " << i;
        }
        expect_state(root, TrainingState::kIdle, ShardedState::kUnsharded, "root after forward");
        for (auto& b : net->blocks) {
          expect_state(b, TrainingState::kIdle, ShardedState::kSharded, "block after forward");
        }
        std::vector<Seen> root_in_backward, first_block_in_backward;
        // Registered after the root's own hook on its output: runs once the root's backward
        // began, before any block's.
        logits.register_hook([&](const at::Tensor& g) {
          root_in_backward.push_back(seen(root));
          first_block_in_backward.push_back(seen(net->blocks[0]));
          return g;
        });
        edge_loss(logits, spec, pg, 0).backward();
        ASSERT_EQ(root_in_backward.size(), 1u);
        EXPECT_EQ(root_in_backward[0].training, TrainingState::kPreBackward);
        EXPECT_EQ(root_in_backward[0].sharded, ShardedState::kUnsharded);
        EXPECT_EQ(first_block_in_backward[0].training, TrainingState::kIdle);
        EXPECT_EQ(first_block_in_backward[0].sharded, ShardedState::kSharded);
        expect_state(root, TrainingState::kIdle, ShardedState::kSharded, "root after backward");
        for (auto& b : net->blocks) {
          expect_state(b, TrainingState::kIdle, ShardedState::kSharded, "block after backward");
        }
        // unshard() and reshard() move the sharded state only.
        net->blocks[1].unshard();
        expect_state(net->blocks[1], TrainingState::kIdle, ShardedState::kUnsharded, "unshard");
        net->blocks[1].reshard();
        expect_state(net->blocks[1], TrainingState::kIdle, ShardedState::kSharded, "reshard");
      },
      test_options());
}

// The switches, read as states: blocks kept after forward (reshard_after_forward off) or after
// backward (reshard_after_backward off), and kShardedPostForward with
// reshard_after_forward_ranks (this rank's rows of a 2-rank group kept at world 4).
TEST(Lifecycle, ReshardSwitchesAsStates) {
  for (int variant = 0; variant < 3; ++variant) {
    EdgeSpec spec;
    if (variant == 2) spec.options.reshard_after_forward_ranks = 2;
    run_local_ranks(
        4,
        [&](const ProcessGroupPtr& pg) {
          auto net = build_edge_net(spec, nullptr);
          auto root = shard_edge_net(net, flat_mesh(pg), spec);
          if (variant == 0) {
            for (auto& b : net->blocks) b.set_reshard_after_forward(false, /*recurse=*/false);
          }
          if (variant == 1) root.set_reshard_after_backward(false);
          auto logits = edge_logits(root, spec, pg, 0);
          const ShardedState after_forward[] = {ShardedState::kUnsharded, ShardedState::kSharded,
                                                ShardedState::kShardedPostForward};
          for (auto& b : net->blocks) {
            expect_state(b, TrainingState::kIdle, after_forward[variant],
                         "after forward, variant " + std::to_string(variant));
          }
          edge_loss(logits, spec, pg, 0).backward();
          const ShardedState after_backward =
              variant == 1 ? ShardedState::kUnsharded : ShardedState::kSharded;
          for (auto& b : net->blocks) {
            expect_state(b, TrainingState::kIdle, after_backward,
                         "after backward, variant " + std::to_string(variant));
          }
          root.reshard();
          for (auto& b : net->blocks) b.reshard();
        },
        test_options());
  }
}

// Every switch that changes what a backward does is refused from inside one, before anything
// changes (set_reshard_after_forward and set_reduce_scatter_unused_params skipped the check).
TEST(Lifecycle, SwitchesRefusedWhileABackwardRuns) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_edge_net(spec, nullptr);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        auto logits = edge_logits(root, spec, pg, 0);
        std::vector<std::string> errors;
        logits.register_hook([&](const at::Tensor& g) {
          const std::vector<std::function<void()>> switches = {
              [&] { root.set_reshard_after_forward(false); },
              [&] { root.set_reduce_scatter_unused_params(true); },
              [&] { root.set_reshard_after_backward(false); },
              [&] { root.set_requires_gradient_sync(false); },
              [&] { root.set_requires_all_reduce(false); }};
          for (const auto& s : switches) {
            try {
              s();
              errors.emplace_back();
            } catch (const InvalidArgument& e) {
              errors.emplace_back(e.what());
            }
          }
          return g;
        });
        pg->reset_stats();
        edge_loss(logits, spec, pg, 0).backward();
        ASSERT_EQ(errors.size(), 5u);
        for (const auto& e : errors) {
          EXPECT_NE(e.find("while a backward of its tree is running"), std::string::npos) << e;
        }
        // Nothing changed: every unit reduced, and the blocks free after forward as before.
        EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), spec.blocks + 1);
        edge_logits(root, spec, pg, 1);
        for (auto& b : net->blocks) {
          EXPECT_EQ(b.sharded_state(), ShardedState::kSharded);
        }
      },
      test_options());
}

// set_gradient_divide_factor at world 1: FSDP2 divides there too (the one-rank fast path used
// to skip it). The gradients are the plain ones divided by the factor.
TEST(Lifecycle, GradientDivideFactorAtWorldOne) {
  EdgeSpec spec;
  run_local_ranks(
      1,
      [&](const ProcessGroupPtr& pg) {
        std::vector<at::Tensor> grads[2];
        for (int variant = 0; variant < 2; ++variant) {
          auto net = build_edge_net(spec, nullptr);
          auto root = shard_edge_net(net, flat_mesh(pg), spec);
          if (variant == 1) {
            for (auto& b : net->blocks) b.set_gradient_divide_factor(4);
            root.set_gradient_divide_factor(4);
          }
          for (int step = 0; step < 2; ++step) {  // accumulated over two backwards
            edge_loss(edge_logits(root, spec, pg, step), spec, pg, step).backward();
          }
          for (const auto& p : net->parameters()) grads[variant].push_back(p.grad().clone());
        }
        ASSERT_EQ(grads[0].size(), grads[1].size());
        for (size_t i = 0; i < grads[0].size(); ++i) {
          EXPECT_TRUE(at::allclose(grads[1][i] * 4, grads[0][i], 1e-6, 1e-7)) << i;
        }
      },
      test_options());
}

// set_is_last_backward(false) leaves reductions in flight into the next backward. With one unit
// the next backward's reduction is its own: the one left in flight must land first (it was
// overwritten, and its gradients lost). Two backwards accumulate the same gradients either way.
TEST(Lifecycle, ReductionLeftInFlightLandsBeforeTheNext) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        std::vector<at::Tensor> grads[2];
        for (int variant = 0; variant < 2; ++variant) {
          auto net = build_edge_net(spec, nullptr);
          auto root = fully_shard(net, flat_mesh(pg), spec.options);  // the only unit
          root.set_is_last_backward(variant == 0);
          edge_loss(edge_logits(root, spec, pg, 0), spec, pg, 0).backward();
          root.set_is_last_backward(true);
          edge_loss(edge_logits(root, spec, pg, 1), spec, pg, 1).backward();
          for (const auto& p : net->parameters()) grads[variant].push_back(p.grad().clone());
        }
        for (size_t i = 0; i < grads[0].size(); ++i) {
          EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i], 1e-6, 1e-7)) << i;
        }
      },
      test_options());
}

// A checkpointed root holding the blocks (units inside it), called twice before one backward
// (two micro-batches summed): each recompute of the root runs the blocks' forwards again inside
// the backward, which must not make a block that already reduced reduce again. One reduction per
// unit per backward, and the gradients of the same run without checkpointing.
TEST(Lifecycle, RecomputeDoesNotRepeatANestedUnitsBackward) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        std::vector<at::Tensor> grads[2];
        for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
          EdgeSpec s = spec;
          s.options.activation_checkpointing = checkpointed == 1;
          auto net = build_edge_net(s, nullptr);
          auto root = shard_edge_net(net, flat_mesh(pg), s);
          pg->reset_stats();
          auto loss = edge_loss(edge_logits(root, s, pg, 0), s, pg, 0) +
                      edge_loss(edge_logits(root, s, pg, 1), s, pg, 1);
          loss.backward();
          EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), s.blocks + 1)
              << (checkpointed ? "checkpointed" : "plain");
          for (auto& b : net->blocks) {
            EXPECT_EQ(b.training_state(), TrainingState::kIdle);
          }
          for (const auto& p : net->parameters()) grads[checkpointed].push_back(p.grad().clone());
        }
        for (size_t i = 0; i < grads[0].size(); ++i) {
          EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i], 1e-5, 1e-7)) << i;
        }
      },
      test_options());
}

// A model destroyed while its reduction is still in flight (set_is_last_backward(false)) frees
// everything it held: its communication buffers and the process group it reduced over (the
// communicator must not outlive the model).
TEST(Lifecycle, AModelDestroyedMidReductionReleasesItsGroup) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        const auto before = pg.use_count();
        {
          auto net = build_edge_net(spec, nullptr);
          auto root = shard_edge_net(net, flat_mesh(pg), spec);
          root.set_is_last_backward(false);
          edge_loss(edge_logits(root, spec, pg, 0), spec, pg, 0).backward();
          EXPECT_GT(root.memory_stats().tree.comm_buffer_bytes, 0) << "a reduction in flight";
        }
        pg->barrier()->wait();  // the other rank's reduction is done with this rank's data
        EXPECT_EQ(pg.use_count(), before);
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
