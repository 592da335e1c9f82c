// Tensor parallelism (fsdp/parallel/tensor_parallel.h) and the Llama model split over it: the
// chunks are torch.chunk's, the vocabulary-parallel loss is cross_entropy's (value and
// gradient), the 2-D mesh puts each rank where init_device_mesh does, and the model at TP 2 and
// 4 (alone, and under fully_shard on a dp x tp mesh, through training steps with the global
// gradient norm) gives the unsplit model's logits, losses and gradients. Against PyTorch's own
// TP + FSDP2: tests/reference/llama_parity.py --tp.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"
#include "support/torch_api.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

using torch::Tensor;

double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_TRUE(got.defined());
  if (!got.defined() || got.sizes() != want.sizes()) return 1e9;
  if (want.numel() == 0) return 0;
  return (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-12);
}

TEST(TensorParallel, ChunksAreTorchChunks) {
  // torch.chunk(arange(n), k): ceil(n / k) each, the last ones shorter or empty.
  for (int64_t n : {0, 1, 5, 7, 1001}) {
    for (int k : {1, 2, 3, 4}) {
      auto pieces = torch::arange(n).chunk(k);
      int64_t covered = 0;
      for (int r = 0; r < k; ++r) {
        const auto c = tp::chunk_of(n, k, r);
        const int64_t want = r < static_cast<int>(pieces.size()) ? pieces[r].numel() : 0;
        EXPECT_EQ(c.length, want) << n << " over " << k << " rank " << r;
        if (want > 0) {
          EXPECT_EQ(c.offset, pieces[r][0].item<int64_t>());
        }
        covered += c.length;
      }
      EXPECT_EQ(covered, n);
    }
  }
  expect_error_containing<InvalidArgument>([&] { tp::chunk_of(4, 2, 2); }, "rank 2 of 2");
}

// The loss over vocabulary chunks equals cross_entropy over the whole logits, value and
// gradient, with ignored targets, at degrees that leave a rank without columns (5 over 4).
TEST(TensorParallel, VocabParallelCrossEntropyIsCrossEntropy) {
  for (int64_t vocab : {5, 11}) {
    torch::manual_seed(3);
    auto logits = torch::randn({6, vocab}) * 3;
    auto targets = torch::randint(vocab, {6}, torch::kLong);
    targets[2] = -100;
    auto whole = logits.clone().requires_grad_(true);
    auto want = torch::nn::functional::cross_entropy(whole, targets);
    want.backward();
    for (int size : {1, 2, 3, 4}) {
      run_local_ranks(
          size,
          [&](const ProcessGroupPtr& g) {
            const auto c = tp::chunk_of(vocab, size, g->rank());
            auto mine = logits.narrow(1, c.offset, c.length).clone().requires_grad_(true);
            auto got = tp::vocab_parallel_cross_entropy(mine, targets, c.offset, vocab, g);
            EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6)
                << "vocab " << vocab << " tp " << size;
            got.backward();
            auto want_grad = whole.grad().narrow(1, c.offset, c.length);
            EXPECT_TRUE(torch::allclose(mine.grad(), want_grad, 1e-5, 1e-7))
                << "vocab " << vocab << " tp " << size << " rank " << g->rank();
            // The full logits gathered back from the chunks.
            EXPECT_TRUE(torch::equal(tp::gather_last_dim(mine.detach(), vocab, g), logits));
          },
          test_options());
    }
  }
}

// A target outside the vocabulary (and not the ignore index) is refused by name, as
// cross_entropy refuses it, instead of counting a zero target logit.
TEST(TensorParallel, VocabParallelCrossEntropyRefusesTargetsOutsideTheVocabulary) {
  auto logits = torch::randn({3, 5});
  for (int64_t bad : {5, -2}) {
    auto targets = torch::tensor({int64_t{1}, bad, int64_t{2}}, torch::kLong);
    expect_error_containing<InvalidArgument>(
        [&] { tp::vocab_parallel_cross_entropy(logits, targets, 0, 5, nullptr); },
        "a target is outside the vocabulary [0, 5) and is not the ignore index -100");
  }
}

// make_device_mesh(world, replicas, tp) places rank r as init_device_mesh((replicate, shard,
// tp)) does: TP groups of consecutive ranks, shard groups of one TP index within a replica.
TEST(TensorParallel, MeshIsInitDeviceMeshs) {
  run_local_ranks(
      8,
      [&](const ProcessGroupPtr& world) {
        auto members = [](const ProcessGroupPtr& g, int world_rank) {
          auto all = torch::empty({g->size()}, torch::kLong);
          g->all_gather(all, torch::tensor({static_cast<int64_t>(world_rank)}))->wait();
          return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + g->size());
        };
        const int r = world->rank();
        auto mesh = make_device_mesh(world, /*replicas=*/2, /*tp=*/2);
        EXPECT_EQ(mesh.tp_size(), 2);
        EXPECT_EQ(mesh.shards(), 2);
        EXPECT_EQ(mesh.replicas(), 2);
        EXPECT_EQ(mesh.dp_size(), 4);
        EXPECT_EQ(mesh.dp_index(), r / 2);
        EXPECT_EQ(mesh.tp_index(), r % 2);
        const int t = r % 2, d = r / 2, rep = d / 2, sh = d % 2;
        EXPECT_EQ(members(mesh.tp, r), (std::vector<int64_t>{2 * d, 2 * d + 1}));
        EXPECT_EQ(members(mesh.shard, r),
                  (std::vector<int64_t>{(rep * 2) * 2 + t, (rep * 2 + 1) * 2 + t}));
        EXPECT_EQ(members(mesh.replicate, r), (std::vector<int64_t>{sh * 2 + t, (2 + sh) * 2 + t}));
        auto flat = make_device_mesh(world, 1, 4);
        EXPECT_EQ(flat.dp_size(), 2);
        EXPECT_FALSE(flat.hybrid());
        EXPECT_EQ(members(flat.shard, r), (std::vector<int64_t>{r % 4, 4 + r % 4}));
        expect_error_containing<InvalidArgument>(
            [&] { make_device_mesh(world, 1, 3); },
            "tensor-parallel degree of 3 does not divide a world of 8");
        expect_error_containing<InvalidArgument>(
            [&] { make_device_mesh(world, 3, 2); },
            "3 replicas do not divide the 4 data-parallel ranks");
      },
      test_options());
}

llama::Config tp_config(bool tied, int64_t kv_heads) {
  auto c = tiny_llama(tied);
  c.num_key_value_heads = kv_heads;  // 4 for TP 4: whole key/value heads per rank
  c.pad_token_id = 3;
  return c;
}

// The reference's gradient of `name` cut to the slice this TP rank holds.
Tensor slice_of(const Tensor& full, const std::map<std::string, tp::TpSlice>& slices,
                const std::string& name) {
  // A tied head is the embedding under a second name (tp_slices names each tensor once).
  auto it = slices.find(
      name == "lm_head.weight" && !slices.count(name) ? "model.embed_tokens.weight" : name);
  if (it == slices.end()) return full;
  return full.narrow(it->second.dim, it->second.chunk.offset, it->second.chunk.length);
}

// Built at TP 2 and 4 from the same seed: each rank holds its slices of the unsplit model's
// values; the forward gives its logits (gathered) and loss, and the backward each slice of its
// gradients (a rank without vocabulary rows too: its empty slices get empty gradients).
TEST(LlamaTensorParallel, SplitModelIsTheWholeModel) {
  // Vocabulary 5 over 4 ranks: chunks of 2, 2, 1 and none.
  for (auto [tied, vocab] :
       {std::pair{false, 1001}, std::pair{true, 1001}, std::pair{false, 5}, std::pair{true, 5}}) {
    auto c = tp_config(tied, 4);
    c.vocab_size = vocab;
    auto reference = build_seeded(c, 11);
    auto tokens = torch::randint(c.vocab_size, {2, 9}, torch::kLong);
    tokens[0][1] = 3;  // the padding row: no gradient either way
    auto targets = torch::randint(c.vocab_size, {2, 9}, torch::kLong);
    auto ref_logits = reference->forward(tokens);
    auto ref_loss = reference->loss(ref_logits, targets);
    ref_loss.backward();
    std::map<std::string, Tensor> ref_params;
    for (const auto& p : reference->named_parameters()) ref_params[p.key()] = p.value();
    for (int size : {2, 4}) {
      run_local_ranks(
          size,
          [&](const ProcessGroupPtr& g) {
            llama::BuildOptions o;
            o.tp = g;
            auto model = build_seeded(c, 11, o);
            const auto slices = llama::tp_slices(c, size, g->rank());
            for (const auto& p : model->named_parameters()) {
              ASSERT_TRUE(torch::equal(p.value(), slice_of(ref_params[p.key()], slices, p.key())))
                  << p.key() << " tp " << size;
            }
            auto logits = model->forward(tokens);
            EXPECT_EQ(logits.size(-1), tp::chunk_of(c.vocab_size, size, g->rank()).length);
            EXPECT_LT(rel_err(model->full_logits(logits), ref_logits), 1e-5) << "tp " << size;
            auto loss = model->loss(logits, targets);
            EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5);
            loss.backward();
            for (const auto& p : model->named_parameters()) {
              auto want = slice_of(ref_params[p.key()].grad(), slices, p.key());
              EXPECT_LT(rel_err(p.value().grad(), want), 1e-5)
                  << p.key() << " tp " << size << (tied ? " tied" : "");
            }
          },
          test_options());
    }
  }
}

// Sequence parallelism (norms and residuals on chunks of the sequence, all-gather and
// reduce-scatter around the split matmuls), with biases on every projection: the same logits,
// loss and gradient slices as the unsplit model; a sequence that does not divide is refused.
TEST(LlamaTensorParallel, SequenceParallelIsTheWholeModel) {
  for (bool tied : {false, true}) {
    auto c = tp_config(tied, 4);
    c.attention_bias = true;
    c.mlp_bias = true;
    auto reference = build_seeded(c, 13);
    auto tokens = torch::randint(c.vocab_size, {2, 8}, torch::kLong);
    auto targets = torch::randint(c.vocab_size, {2, 8}, torch::kLong);
    auto ref_logits = reference->forward(tokens);
    auto ref_loss = reference->loss(ref_logits, targets);
    ref_loss.backward();
    std::map<std::string, Tensor> ref_params;
    for (const auto& p : reference->named_parameters()) ref_params[p.key()] = p.value();
    for (int size : {2, 4}) {
      run_local_ranks(
          size,
          [&](const ProcessGroupPtr& g) {
            llama::BuildOptions o;
            o.tp = g;
            o.sequence_parallel = true;
            auto model = build_seeded(c, 13, o);
            EXPECT_TRUE(model->sequence_parallel());
            const auto slices = llama::tp_slices(c, size, g->rank());
            auto logits = model->forward(tokens);
            EXPECT_LT(rel_err(model->full_logits(logits), ref_logits), 1e-5) << "tp " << size;
            auto loss = model->loss(logits, targets);
            EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5);
            loss.backward();
            for (const auto& p : model->named_parameters()) {
              auto want = slice_of(ref_params[p.key()].grad(), slices, p.key());
              EXPECT_LT(rel_err(p.value().grad(), want), 1e-5)
                  << p.key() << " tp " << size << (tied ? " tied" : "");
            }
            expect_error_containing<InvalidArgument>(
                [&] {
                  model->forward(torch::randint(c.vocab_size, {1, 7}, torch::kLong));
                },
                "sequence (7 tokens) to divide by the tensor-parallel degree");
          },
          test_options());
    }
  }
}

// A degree that does not divide the heads is refused by name, before anything is built.
TEST(LlamaTensorParallel, HeadsMustDivide) {
  auto c = tp_config(false, 2);
  expect_error_containing<InvalidArgument>(
      [&] { llama::validate_tp(c, 4); },
      "tensor-parallel degree of 4 must divide the attention heads (4) and the "
      "key/value heads (2)");
  expect_error_containing<InvalidArgument>([&] { llama::tp_slices(c, 3, 0); }, "degree of 3");
}

// dp 2 x tp 2 on four thread ranks (each layer fully_shard-ed over its TP index's data-parallel
// ranks as it is built), trained by AdamW with the gradient clipped by the global norm: the
// same losses, norms and parameters as the unsplit model on the whole batch.
TEST(LlamaTensorParallel, TrainsAsTheWholeModelUnderFsdp) {
  for (bool sp : {false, true}) {
    auto c = tp_config(false, 2);
    const int steps = 3;
    const int64_t batch = 4, seq = 8;
    const double lr = 1e-2, max_norm = 0.5;
    std::vector<Tensor> inputs, labels;
    torch::manual_seed(21);
    for (int s = 0; s < steps; ++s) {
      inputs.push_back(torch::randint(c.vocab_size, {batch, seq}, torch::kLong));
      labels.push_back(torch::randint(c.vocab_size, {batch, seq}, torch::kLong));
    }
    auto options = torch::optim::AdamWOptions(lr).weight_decay(0.1);
    auto reference = build_seeded(c, 5);
    torch::optim::AdamW ref_opt(reference->parameters(), options);
    std::vector<double> ref_losses, ref_norms;
    for (int s = 0; s < steps; ++s) {
      ref_opt.zero_grad();
      auto loss = reference->loss(reference->forward(inputs[s]), labels[s]);
      loss.backward();
      ref_losses.push_back(loss.item<double>());
      ref_norms.push_back(torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm));
      ref_opt.step();
    }
    std::map<std::string, Tensor> ref_params;
    for (const auto& p : reference->named_parameters()) ref_params[p.key()] = p.value();

    run_local_ranks(
        4,
        [&](const ProcessGroupPtr& world) {
          auto mesh = make_device_mesh(world, 1, 2);
          llama::BuildOptions o;
          o.tp = mesh.tp;
          o.sequence_parallel = sp;
          o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
            fully_shard(layer, mesh);
          };
          auto model = build_seeded(c, 5, o);
          auto root = fully_shard(model, mesh);
          const auto slices = llama::tp_slices(c, mesh.tp_size(), mesh.tp_index());
          TensorParallelNorm norm{mesh.tp,
                                  [&](const std::string& name) { return slices.count(name) > 0; }};
          torch::optim::AdamW opt(model->parameters(), options);
          const int64_t per = batch / mesh.dp_size();
          for (int s = 0; s < steps; ++s) {
            opt.zero_grad();
            auto x = inputs[s].narrow(0, mesh.dp_index() * per, per);
            auto y = labels[s].narrow(0, mesh.dp_index() * per, per);
            auto loss = model->loss(root(x), y);
            loss.backward();
            auto mean = loss.detach().reshape({1}).clone();
            world->all_reduce(mean, ReduceOp::kAvg)->wait();
            EXPECT_NEAR(mean.item<double>(), ref_losses[s], 1e-5 * ref_losses[s])
                << "step " << s << (sp ? " sp" : "");
            const double total = clip_grad_norm_(root, max_norm, norm);
            EXPECT_NEAR(total, ref_norms[s], 1e-5 * ref_norms[s])
                << "step " << s << (sp ? " sp" : "");
            opt.step();
          }
          for (const auto& [name, shard] : parameter_shards(*model)) {
            auto want = slice_of(ref_params.at(name), slices, name).detach();
            auto full = gather_full(mesh.shard, shard.local.detach(), want.size(0));
            // AdamW's update is the gradient's sign for elements whose gradient is tiny, so the
            // rounding of the split sums (row-parallel o_proj adds its halves in another order)
            // reaches the parameters amplified: 1.8e-4 measured on one Xeon, under 1e-4 on
            // others. A wrong split or reduction is off by far more.
            EXPECT_LT(rel_err(full, want), 5e-4) << name << (sp ? " sp" : "");
          }
        },
        test_options());
  }
}

// A full state dict of the unsplit model sets a model split 2 x 2 (each rank its slice's rows),
// from every rank or from rank 0; the full state dict read back is the same tensors, bit for
// bit. A state dict of slices (the wrong frame) is refused by name on every rank.
TEST(LlamaTensorParallel, FullStateDictSetsASplitModel) {
  for (bool tied : {false, true}) {
    auto c = tp_config(tied, 2);
    auto reference = build_seeded(c, 5);
    FullStateDict want;
    for (const auto& p : reference->named_parameters()) {
      if (tied && p.key() == "lm_head.weight") continue;  // one name per tensor
      want.emplace_back(p.key(), p.value().detach().clone());
    }
    run_local_ranks(
        4,
        [&](const ProcessGroupPtr& world) {
          auto mesh = make_device_mesh(world, 1, 2);
          llama::BuildOptions o;
          o.tp = mesh.tp;
          o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
            fully_shard(layer, mesh);
          };
          auto model = build_seeded(c, 6, o);  // other values
          fully_shard(model, mesh);
          FullStateDictOptions options;
          options.tp = llama::tp_layout(c, mesh.tp, mesh.dp_group());
          for (bool rank0_only : {false, true}) {
            options.rank0_only = rank0_only;
            set_model_state_dict(*model, rank0_only && world->rank() != 0 ? FullStateDict{} : want,
                                 world, options);
            options.rank0_only = false;
            const auto got = get_full_model_state_dict(*model, world, options);
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i) {
              EXPECT_EQ(got[i].first, want[i].first);
              EXPECT_TRUE(at::equal(got[i].second, want[i].second))
                  << got[i].first << (rank0_only ? " rank0_only" : "") << (tied ? " tied" : "");
            }
          }
          FullStateDict sliced;
          for (const auto& [name, t] : want) {
            const auto* slice = options.tp.slice_of(name);
            sliced.emplace_back(name, slice ? t.narrow(slice->dim, 0, slice->chunk.length) : t);
          }
          expect_error_containing<InvalidArgument>(
              [&] { set_model_state_dict(*model, sliced, world, options); },
              "in the state dict, the model's is");
        },
        test_options());
  }
}

// One 3-step run of the tiny Llama at world 4 as dp x tp (tp 1: FSDP alone) from the same seed
// and batches, each unit sharded with `options` and the tree set up by `setup`; the mean loss of
// every step.
std::vector<double> tp_losses(int tp, const FullyShardOptions& options,
                              const std::function<void(FSDPModule&)>& setup = {}) {
  auto c = tp_config(false, 2);
  const int steps = 3;
  const int64_t batch = 4, seq = 8;
  std::vector<Tensor> inputs, labels;
  {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(31);
    for (int s = 0; s < steps; ++s) {
      inputs.push_back(at::randint(c.vocab_size, {batch, seq}, gen));
      labels.push_back(at::randint(c.vocab_size, {batch, seq}, gen));
    }
  }
  std::vector<double> losses;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& world) {
        auto mesh = make_device_mesh(world, 1, tp);
        llama::BuildOptions o;
        o.tp = mesh.tp;
        o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
          fully_shard(layer, mesh, options);
        };
        auto model = build_seeded(c, 5, o);
        auto root = fully_shard(model, mesh, options);
        if (setup) setup(root);
        torch::optim::AdamW opt(root.parameters(), torch::optim::AdamWOptions(1e-2));
        const int64_t per = batch / mesh.dp_size();
        for (int s = 0; s < steps; ++s) {
          opt.zero_grad();
          auto x = inputs[s].narrow(0, mesh.dp_index() * per, per);
          auto y = labels[s].narrow(0, mesh.dp_index() * per, per);
          auto loss = model->loss(root(x), y);
          loss.backward();
          opt.step();
          auto mean = loss.detach().to(at::kDouble).reshape({1}).clone();
          world->all_reduce(mean, ReduceOp::kAvg)->wait();
          if (world->rank() == 0) losses.push_back(mean.item<double>());
        }
      },
      test_options());
  return losses;
}

double worst_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / b[i]);
  return worst;
}

// Under 2 x 2 the unit options compose as without TP: CPU offload and shards on dim 1 train bit
// for bit as plain; bf16 compute stays within bf16's rounding of FSDP alone in bf16; the
// quantized all-gather near the plain curve without equalling it.
TEST(LlamaTensorParallel, UnitOptionsComposeWithTp) {
  const auto plain = tp_losses(2, {});
  ASSERT_EQ(plain.size(), 3u);

  FullyShardOptions offload;
  offload.offload_policy = CPUOffloadPolicy{};
  EXPECT_EQ(tp_losses(2, offload), plain) << "CPU offload under TP";

  FullyShardOptions dim1;
  dim1.shard_placement_fn = [](const std::string&, const at::Tensor& p) -> std::optional<int64_t> {
    if (p.dim() == 2 && p.size(1) % 2 == 0) return 1;
    return std::nullopt;
  };
  EXPECT_EQ(tp_losses(2, dim1), plain) << "shards on dim 1 under TP";

  FullyShardOptions bf16;
  bf16.mp_policy.param_dtype = at::kBFloat16;
  bf16.mp_policy.reduce_dtype = at::kFloat;
  const auto tp_bf16 = tp_losses(2, bf16), fsdp_bf16 = tp_losses(1, bf16);
  EXPECT_LT(worst_rel(tp_bf16, fsdp_bf16), 1e-2);
  EXPECT_LT(worst_rel(tp_bf16, plain), 2e-2);

  const auto quantized = tp_losses(2, {}, [](FSDPModule& root) {
    root.set_custom_all_gather(quantized_all_gather(), /*recurse=*/true);
  });
  EXPECT_LT(worst_rel(quantized, plain), 2e-2);
  EXPECT_GT(worst_rel(quantized, plain), 0);
  std::printf(
      "under 2 x 2: bf16 against FSDP alone in bf16 %.2e, against fp32 %.2e; int8 "
      "all-gather against plain %.2e\n",
      worst_rel(tp_bf16, fsdp_bf16), worst_rel(tp_bf16, plain), worst_rel(quantized, plain));
}

}  // namespace
}  // namespace fsdp::testing
