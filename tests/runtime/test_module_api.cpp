// FSDP2's FSDPModule methods, each modelled on FSDP2's own tests (test_fully_shard_training.py,
// _comm.py, _overlap.py, _mixed_precision.py): counts of collectives, what is gathered when,
// and parity with a single process where the method changes the schedule only.
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "runtime/edge_cases.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

int64_t gathers(const ProcessGroupPtr& pg) { return pg->stats().count(CollectiveKind::kAllGather); }
int64_t reductions(const ProcessGroupPtr& pg) {
  return pg->stats().count(CollectiveKind::kReduceScatter);
}

at::Tensor loss_on(Unit<EdgeNet>& root, const EdgeSpec& spec, const ProcessGroupPtr& pg, int step) {
  auto [x, y] = edge_batch(spec, step);
  const int64_t local = spec.batch / pg->size();
  return torch::nn::functional::cross_entropy(root(rank_slice(x, pg, local)),
                                              rank_slice(y, pg, local));
}

// unshard(async_op) returns a handle; the gather lands by wait() or the next forward, which
// then gathers nothing more for the unit; reshard() frees it again.
TEST(ModuleApi, UnshardAsyncAndReshard) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_edge_net(spec, nullptr);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        pg->reset_stats();
        auto handle = root.unshard(/*async_op=*/true);
        EXPECT_EQ(gathers(pg), 1);
        handle.wait();
        EXPECT_EQ(net->in->weight.size(0), spec.dim) << "full after wait()";
        EXPECT_GT(root.memory_stats().tree.full_param_bytes, 0);
        handle.wait();  // a second wait is a no-op
        pg->reset_stats();
        auto loss = loss_on(root, spec, pg, 0);
        EXPECT_EQ(gathers(pg), spec.blocks) << "the root was gathered already";
        loss.backward();
        root.reshard();
        EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0);
        // A pending async gather is consumed by the forward.
        root.unshard(/*async_op=*/true);
        pg->reset_stats();
        loss_on(root, spec, pg, 1).backward();
        EXPECT_EQ(gathers(pg), 2 * spec.blocks) << "forward and backward of the blocks only";
      },
      test_options());
}

// set_reshard_after_forward switches the backward's gathers off and on (FSDP2's counts).
TEST(ModuleApi, SetReshardAfterForward) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_edge_net(spec, nullptr);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        auto backward_gathers = [&](int step) {
          auto loss = loss_on(root, spec, pg, step);
          pg->reset_stats();
          loss.backward();
          return gathers(pg);
        };
        EXPECT_EQ(backward_gathers(0), spec.blocks) << "blocks reshard, the root keeps";
        root.set_reshard_after_forward(false);
        EXPECT_EQ(backward_gathers(1), 0);
        root.set_reshard_after_forward(true);
        EXPECT_EQ(backward_gathers(2), spec.blocks + 1) << "the root too, when set";
        root.set_reshard_after_forward(false, /*recurse=*/false);
        EXPECT_EQ(backward_gathers(3), spec.blocks);
      },
      test_options());
}

// set_reshard_after_backward(false) keeps the parameters between micro-batches: the next
// forward gathers nothing; with it back on the last backward reshards. Same result as one
// process.
TEST(ModuleApi, SetReshardAfterBackwardForAccumulation) {
  EdgeSpec spec;
  spec.batch = 24;  // two micro-batches on every rank at worlds 2 and 4
  auto counts = std::make_shared<std::map<int, std::vector<int64_t>>>();
  std::mutex mu;
  auto program = [&](EdgeStep& s) {
    s.opt.zero_grad();
    for (int k = 0; k < 2; ++k) {
      if (s.root) {
        s.root->set_requires_gradient_sync(k == 1);
        s.root->set_reshard_after_backward(k == 1);
        s.pg->reset_stats();
      }
      auto loss = s.loss_part(k, 2);
      if (s.root && s.pg->rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        (*counts)[s.pg->size()].push_back(gathers(s.pg));
      }
      loss.backward();
    }
    if (s.root) {
      EXPECT_EQ(s.root->memory_stats().tree.full_param_bytes, 0) << "resharded at the end";
    }
    s.opt.step();
  };
  const auto want = reference_of(spec, program);
  for (int world : {2, 4}) {
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          expect_edge_parity("reshard_after_backward", spec, flat_mesh(pg), program, want);
        },
        test_options());
    const auto& c = (*counts)[world];
    ASSERT_EQ(c.size(), 2u * spec.steps);
    for (int step = 0; step < spec.steps; ++step) {
      EXPECT_EQ(c[2 * step], spec.blocks + 1) << "first micro-batch: resharded by the last";
      EXPECT_EQ(c[2 * step + 1], 0) << "second micro-batch: kept from the first";
    }
  }
}

// reshard_after_forward as an int (hpZ): after forward each rank keeps its rows of a group of 2;
// the backward's gathers run within that group (none on the world group), with the same result.
TEST(ModuleApi, ReshardAfterForwardToSmallerGroup) {
  EdgeSpec spec;
  spec.options.reshard_after_forward_ranks = 2;
  auto program = zero_grad_program(ZeroGradAt::kBeforeForward, true);
  EdgeSpec plain = spec;
  plain.options.reshard_after_forward_ranks = 0;
  const auto want = reference_of(plain, program);
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        expect_edge_parity("hpZ", spec, flat_mesh(pg), program, want);
        auto net = build_edge_net(spec, nullptr);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        pg->reset_stats();
        auto loss = loss_on(root, spec, pg, 0);
        EXPECT_EQ(gathers(pg), spec.blocks + 1);
        const auto m = root.memory_stats();
        EXPECT_EQ(m.tree.full_param_bytes, 0) << "resharded after forward";
        EXPECT_GT(m.tree.comm_buffer_bytes, 0) << "the smaller group's shards are kept";
        pg->reset_stats();
        loss.backward();
        EXPECT_EQ(gathers(pg), 0) << "backward gathers within the groups of 2";
        EXPECT_EQ(reductions(pg), spec.blocks + 1);
        EXPECT_EQ(root.memory_stats().tree.comm_buffer_bytes, 0);
        // Not a proper divisor of the world: refused before anything is sharded.
        EdgeSpec bad = spec;
        for (int ranks : {3, 4, 1}) {
          bad.options.reshard_after_forward_ranks = ranks;
          auto other = build_edge_net(bad, nullptr);
          expect_error_containing<InvalidArgument>(
              [&] { fully_shard(other->blocks[0], pg, bad.options); },
              "reshard_after_forward_ranks");
        }
      },
      test_options());
}

// Explicit forward prefetch: when block 0 computes, the gathers of the blocks it names are
// issued already (by the recorded order only the next one would be, and on the first step
// none); the step's gathers stay one per unit.
TEST(ModuleApi, ExplicitForwardPrefetch) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto probe = std::make_shared<Probe>();
        std::map<int, int64_t> seen;
        probe->on_forward = [&](int block, const at::Tensor&) { seen[block] = gathers(pg); };
        auto net = build_edge_net(spec, probe);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        pg->reset_stats();
        loss_on(root, spec, pg, 0).backward();
        EXPECT_EQ(seen[0], 2) << "first step, no order yet: the root and block 0";
        pg->reset_stats();
        loss_on(root, spec, pg, 1).backward();
        EXPECT_EQ(seen[0], 3) << "recorded order: block 1 prefetched";
        net->blocks[0].set_modules_to_forward_prefetch({net->blocks[1], net->blocks[2]});
        pg->reset_stats();
        auto loss = loss_on(root, spec, pg, 2);
        EXPECT_EQ(seen[0], 4) << "blocks 1 and 2 issued before block 0 computes";
        EXPECT_EQ(gathers(pg), spec.blocks + 1) << "still one gather per unit";
        loss.backward();
      },
      test_options());
}

// Explicit backward prefetch: when the gradient reaches block 2's input (its backward is
// done), the gathers of the blocks it names have been issued.
TEST(ModuleApi, ExplicitBackwardPrefetch) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto probe = std::make_shared<Probe>();
        int64_t at_block2 = -1;
        probe->on_forward = [&](int block, const at::Tensor& x) {
          if (block == 2 && x.requires_grad()) {
            x.register_hook([&](const at::Tensor& g) {
              at_block2 = gathers(pg);
              return g;
            });
          }
        };
        auto net = build_edge_net(spec, probe);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        auto backward = [&](int step) {
          auto loss = loss_on(root, spec, pg, step);
          pg->reset_stats();
          loss.backward();
          return gathers(pg);
        };
        EXPECT_EQ(backward(0), spec.blocks);
        EXPECT_EQ(at_block2, 2) << "block 2 and, by the recorded order, block 1";
        net->blocks[2].set_modules_to_backward_prefetch({net->blocks[1], net->blocks[0]});
        EXPECT_EQ(backward(1), spec.blocks) << "one gather per unit still";
        EXPECT_EQ(at_block2, 3) << "blocks 1 and 0 issued while block 2 computed";
      },
      test_options());
}

// set_is_last_backward(false): reductions may stay in flight after a backward (micro-batches
// reducing each time); the last backward finishes them. Same result as one process.
TEST(ModuleApi, SetIsLastBackward) {
  EdgeSpec spec;
  spec.batch = 24;
  std::atomic<int> in_flight_seen{0};
  auto program = [&](EdgeStep& s) {
    s.opt.zero_grad();
    for (int k = 0; k < 2; ++k) {
      if (s.root) s.root->set_is_last_backward(k == 1);
      s.loss_part(k, 2).backward();
      if (s.root && k == 0 && s.root->memory_stats().tree.comm_buffer_bytes > 0) ++in_flight_seen;
      if (s.root && k == 1) {
        EXPECT_EQ(s.root->memory_stats().tree.comm_buffer_bytes, 0) << "the last backward";
      }
    }
    s.opt.step();
  };
  const auto want = reference_of(spec, program);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        expect_edge_parity("is_last_backward", spec, flat_mesh(pg), program, want);
      },
      test_options());
  EXPECT_GT(in_flight_seen.load(), 0) << "a reduction stayed in flight past a non-last backward";
}

// Hybrid sharding: set_requires_all_reduce(false) reduce-scatters but skips the all-reduce
// across replicas; the next backward with it on all-reduces both micro-batches at once.
TEST(ModuleApi, SetRequiresAllReduce) {
  EdgeSpec spec;
  spec.batch = 24;
  std::map<int, int64_t> all_reduces;
  std::mutex mu;
  auto program = [&](EdgeStep& s) {
    s.opt.zero_grad();
    for (int k = 0; k < 2; ++k) {
      if (s.root) s.root->set_requires_all_reduce(k == 1);
      s.loss_part(k, 2).backward();
    }
    s.opt.step();
  };
  const auto want = reference_of(spec, program);
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto mesh = make_device_mesh(pg, 2);
        mesh.replicate->reset_stats();
        mesh.shard->reset_stats();
        expect_edge_parity("requires_all_reduce", spec, mesh, program, want);
        std::lock_guard<std::mutex> lock(mu);
        all_reduces[pg->rank()] = mesh.replicate->stats().count(CollectiveKind::kAllReduce);
        EXPECT_EQ(mesh.shard->stats().count(CollectiveKind::kReduceScatter),
                  2 * (spec.blocks + 1) * spec.steps);
      },
      test_options());
  for (const auto& [rank, n] : all_reduces) {
    EXPECT_EQ(n, (spec.blocks + 1) * spec.steps) << "rank " << rank << ": once per step per unit";
  }
}

// set_gradient_divide_factor: the gradient is the sum over ranks divided by the factor.
TEST(ModuleApi, SetGradientDivideFactor) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        std::vector<at::Tensor> grads[2];
        for (int variant = 0; variant < 2; ++variant) {
          auto net = build_edge_net(spec, nullptr);
          auto root = shard_edge_net(net, flat_mesh(pg), spec);
          if (variant == 1) {
            for (auto& b : net->blocks) b.set_gradient_divide_factor(0.5);
            root.set_gradient_divide_factor(0.5);
          }
          loss_on(root, spec, pg, 0).backward();
          for (const auto& p : net->parameters()) grads[variant].push_back(p.grad().clone());
        }
        // Average over 2 ranks vs the sum divided by 0.5: a factor of 4.
        for (size_t i = 0; i < grads[0].size(); ++i) {
          EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i] * 4, 1e-5, 1e-7)) << i;
        }
        expect_error_containing<InvalidArgument>(
            [&] { FSDPModule().set_gradient_divide_factor(1); }, "not applied");
      },
      test_options());
}

// set_reduce_scatter_unused_params: a unit that ran but whose parameters got no gradient on
// one rank (it returned its input there) still joins the reduce-scatter with zeros.
TEST(ModuleApi, ReduceScatterUnusedParams) {
  EdgeSpec spec;
  spec.steps = 2;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto probe = std::make_shared<Probe>();
        auto net = build_edge_net(spec, probe);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        root.set_reduce_scatter_unused_params(true);
        if (pg->rank() == 1) probe->identity_block = 1;
        for (int step = 0; step < spec.steps; ++step) {
          pg->reset_stats();
          loss_on(root, spec, pg, step).backward();
          EXPECT_EQ(reductions(pg), spec.blocks + 1) << "every unit reduced on every rank";
        }
        for (const auto& p : net->blocks[1]->parameters()) {
          ASSERT_TRUE(p.grad().defined());
          EXPECT_TRUE(at::isfinite(p.grad()).all().item<bool>());
        }
      },
      test_options());
}

// MixedPrecisionPolicy: floating inputs reach the unit in param_dtype (unless
// cast_forward_inputs is off) and its outputs leave in output_dtype.
TEST(ModuleApi, MixedPrecisionInputsAndOutputs) {
  for (bool cast : {true, false}) {
    EdgeSpec spec;
    run_local_ranks(
        2,
        [&](const ProcessGroupPtr& pg) {
          auto probe = std::make_shared<Probe>();
          std::map<int, at::ScalarType> seen;
          probe->on_forward = [&](int block, const at::Tensor& x) {
            seen[block] = x.scalar_type();
          };
          auto net = build_edge_net(spec, probe);
          FullyShardOptions block_options;
          block_options.mp_policy.param_dtype = at::kBFloat16;
          block_options.mp_policy.output_dtype = at::kFloat;
          block_options.mp_policy.cast_forward_inputs = cast;
          for (auto& b : net->blocks) fully_shard(b, pg, block_options);
          auto root = fully_shard(net, pg);
          auto x = edge_batch(spec, 0).first;
          if (cast) {
            auto out = root(rank_slice(x, pg, 6));
            EXPECT_EQ(out.scalar_type(), at::kFloat);
            for (int b = 0; b < spec.blocks; ++b) EXPECT_EQ(seen[b], at::kBFloat16) << b;
          } else {
            // fp32 input against bf16 weights: the block's own matmul refuses.
            EXPECT_THROW(root(rank_slice(x, pg, 6)), std::exception);
            EXPECT_EQ(seen[0], at::kFloat);
            EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0) << "the failed step tidied";
          }
        },
        test_options());
  }
}

// Unit::call runs another method through FSDP (register_fsdp_forward_method): gathered around
// it, and its backward reduces like a forward's.
TEST(ModuleApi, CallAnotherMethod) {
  EdgeSpec spec;
  auto reference = build_edge_net(spec, nullptr);
  auto [x, y] = edge_batch(spec, 0);
  reference->encode(x).pow(2).mean().backward();
  const at::Tensor want = reference->in->weight.grad();
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_edge_net(spec, nullptr);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        pg->reset_stats();
        auto out = root.call(&EdgeNetImpl::encode, rank_slice(x, pg, 6));
        EXPECT_EQ(gathers(pg), 1);
        EXPECT_TRUE(at::allclose(out, reference->encode(rank_slice(x, pg, 6)), 1e-6, 1e-6));
        (out.pow(2).mean()).backward();
        auto full = gather_full(pg, net->in->weight.grad(), spec.dim);
        EXPECT_TRUE(at::allclose(full, want, 1e-5, 1e-7));
      },
      test_options());
}

// ignored_params stay whole on every rank, are not gathered and their gradients not reduced:
// each rank keeps its own slice's gradient.
TEST(ModuleApi, IgnoredParams) {
  EdgeSpec spec;
  auto [x, y] = edge_batch(spec, 0);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_edge_net(spec, nullptr);
        for (auto& b : net->blocks) fully_shard(b, pg);
        FullyShardOptions options;
        options.ignored_params = {net->head->bias};
        auto root = fully_shard(net, pg, options);
        EXPECT_EQ(net->head->bias.size(0), spec.classes) << "not sharded";
        EXPECT_LT(net->head->weight.size(0), spec.classes) << "sharded";
        torch::nn::functional::cross_entropy(root(rank_slice(x, pg, 6)), rank_slice(y, pg, 6))
            .backward();
        // This rank's own gradient of the bias, from an unsharded model on its slice.
        auto local = build_edge_net(spec, nullptr);
        torch::nn::functional::cross_entropy(local(rank_slice(x, pg, 6)), rank_slice(y, pg, 6))
            .backward();
        EXPECT_TRUE(at::allclose(net->head->bias.grad(), local->head->bias.grad(), 1e-5, 1e-7));
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
