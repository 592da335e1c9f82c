// The planner's Llama (llama_plan.h): the op-by-op activation count against the bytes the
// forward really keeps (the counting host allocator), the units' parameters against the
// model's, and plans for Llama 3 8B and 70B.
#include <gtest/gtest.h>

#include "fsdp/comm/fake_group.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_plan.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/tools/memory.h"
#include "fsdp/tools/planner.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"
#include "support/torch_api.h"

namespace fsdp::testing {
namespace {

// The counting allocator must see every tensor of these tests; installed once, before any.
class HostTensors : public ::testing::Environment {
 public:
  void SetUp() override { track_host_tensor_memory(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new HostTensors);

int64_t allocated() { return host_tensor_memory().allocated; }

struct LayerCase {
  int64_t hidden, heads, kv_heads, head_dim, intermediate, seq, batch;
  torch::ScalarType dtype;
};

void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << "hidden " << c.hidden << ", heads " << c.heads << "/" << c.kv_heads << ", head_dim "
      << c.head_dim << ", " << c10::toString(c.dtype);
}

class LayerActivations : public ::testing::TestWithParam<LayerCase> {};

// What a decoder layer's forward keeps is what layer_activation_bytes counts, to 1%: the count
// names every saved tensor, so a change in the ops shows here first.
TEST_P(LayerActivations, MatchTheOpByOpCount) {
  const auto p = GetParam();
  llama::Config c = tiny_llama();
  c.hidden_size = p.hidden;
  c.num_attention_heads = p.heads;
  c.num_key_value_heads = p.kv_heads;
  c.head_dim = p.head_dim;
  c.intermediate_size = p.intermediate;
  llama::BuildOptions o;
  o.dtype = p.dtype;
  llama::DecoderLayer layer(c, o);
  auto x = torch::randn({p.batch, p.seq, p.hidden}).to(p.dtype).set_requires_grad(true);
  auto [cos, sin] = llama::rotary_cos_sin(c, p.seq, p.dtype, torch::kCPU);
  const int64_t before = allocated();
  auto y = layer->forward(x, cos, sin);
  int64_t kept = allocated() - before;
  // In bf16 the output is kept here only because the test holds it: in a stack, the next
  // layer's norm keeps an fp32 copy of it instead (its own count) and the output is freed.
  if (p.dtype != torch::kFloat) kept -= y.numel() * y.element_size();
  const int64_t want = llama::layer_activation_bytes(c, p.batch * p.seq, p.seq,
                                                     static_cast<int>(c10::elementSize(p.dtype)));
  EXPECT_NEAR(static_cast<double>(kept), static_cast<double>(want), 0.01 * want)
      << "kept " << kept << " bytes, counted " << want;
  y.sum().backward();  // the graph is real and complete
  EXPECT_TRUE(x.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerActivations,
                         ::testing::Values(LayerCase{64, 4, 2, 0, 160, 32, 2, torch::kFloat},
                                           LayerCase{96, 6, 6, 0, 256, 16, 3, torch::kFloat},
                                           LayerCase{64, 4, 1, 24, 128, 64, 1, torch::kFloat},
                                           LayerCase{64, 4, 2, 0, 160, 32, 2, torch::kBFloat16},
                                           LayerCase{96, 8, 2, 16, 200, 24, 2, torch::kBFloat16}),
                         [](const ::testing::TestParamInfo<LayerCase>& info) {
                           const auto& p = info.param;
                           return "hidden" + std::to_string(p.hidden) + "_heads" +
                                  std::to_string(p.heads) + "_kv" + std::to_string(p.kv_heads) +
                                  "_hd" + std::to_string(p.head_dim) + "_" +
                                  (p.dtype == torch::kFloat ? "fp32" : "bf16");
                         });

// The root's forward and the loss keep the embedding's output, cos/sin, the final norm's
// tensors, the logits and the log-probabilities.
TEST(LlamaPlan, RootActivationsMatchTheCount) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    llama::Config c = tiny_llama();
    c.num_hidden_layers = 0;
    llama::BuildOptions o;
    o.dtype = dtype;
    auto model = llama::build_llama(c, o);
    const int64_t batch = 3, seq = 16;
    auto tokens = torch::randint(c.vocab_size, {batch, seq}, torch::kLong);
    auto targets = torch::randint(c.vocab_size, {batch, seq}, torch::kLong);
    const int64_t before = allocated();
    auto logits = model->forward(tokens);
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, c.vocab_size}).to(torch::kFloat), targets.reshape(-1));
    const int64_t kept = allocated() - before;
    const int64_t want = llama::root_activation_bytes(c, batch * seq, seq,
                                                      static_cast<int>(c10::elementSize(dtype)));
    EXPECT_NEAR(static_cast<double>(kept), static_cast<double>(want), 0.01 * want)
        << c10::toString(dtype) << ": kept " << kept << " bytes, counted " << want;
  }
}

// The units hold every parameter of the model once, the root first.
TEST(LlamaPlan, UnitsHoldTheModelsParameters) {
  for (bool tied : {false, true}) {
    auto c = tiny_llama(tied);
    c.attention_bias = true;
    llama::PlanShape shape{c, 32, 2};
    auto units = llama::plan_units(shape);
    ASSERT_EQ(units.size(), 3u);
    EXPECT_EQ(units[0].name, "(root)");
    EXPECT_FALSE(units[0].reshard_after_forward);
    EXPECT_EQ(units[1].name, "model.layers.0");
    EXPECT_EQ(units[2].name, "model.layers.1");
    EXPECT_EQ(units[0].params.size(), tied ? 2u : 3u);  // embedding, norm (, head)
    EXPECT_EQ(units[1].params.size(), 13u);             // 4 weights + 4 biases, 3, 2 norms
    int64_t total = 0;
    for (const auto& u : units) {
      for (const auto& p : u.params) total += p.numel();
    }
    EXPECT_EQ(total, llama::parameter_count(c));
  }
}

// Llama 3 8B on 8 ranks and 70B on 64, bf16 compute over fp32 shards: the shards are the
// parameters over the ranks (padding aside), and the plan is printable.
TEST(LlamaPlan, Llama3On8And64Ranks) {
  struct Case {
    const char* preset;
    int world;
  };
  for (const auto& [preset, world] : {Case{"llama3-8b", 8}, Case{"llama3-70b", 64}}) {
    auto c = *llama::preset_config(preset);
    llama::PlanShape shape{c, 8192, 1, 2, /*activation_checkpointing=*/true};
    fsdp::plan::PlanRequest r;
    r.units = llama::plan_units(shape);
    r.layout = {world, 1, 8};
    r.dtypes = {4, 2, 4};
    r.transient_bytes = llama::loss_transient_bytes(c, 8192);
    auto plan = fsdp::plan::make_plan(r);
    const double params = static_cast<double>(llama::parameter_count(c));
    EXPECT_NEAR(static_cast<double>(plan.memory.param_shards), params * 4 / world,
                0.001 * params * 4 / world)
        << preset;
    EXPECT_EQ(plan.memory.optimizer_states, 2 * plan.memory.param_shards);
    auto text = fsdp::plan::format_plan(r, plan);
    EXPECT_FALSE(text.empty());
    std::cout << preset << " on " << world << " ranks:\n" << text << "\n";
  }
}

// Under tensor parallelism the units hold TP rank 0's slices (the largest chunks), each layer
// sums two activations over the group per forward and the root one, and the plan counts those
// all-reduces on a "tp" group: forward and backward, and the recompute of checkpointed layers.
TEST(LlamaPlan, TensorParallelUnitsAreSlicesAndCountTheirAllReduces) {
  auto c = tiny_llama();
  for (bool checkpointed : {false, true}) {
    llama::PlanShape shape{c, 32, 2, 4, checkpointed, /*tp=*/2};
    auto units = llama::plan_units(shape);
    const auto slices = llama::tp_slices(c, 2, 0);
    int64_t want = 0;
    for (auto [name, full] : llama::parameter_shapes(c)) {
      if (auto it = slices.find(name); it != slices.end())
        full[it->second.dim] = it->second.chunk.length;
      int64_t n = 1;
      for (auto d : full) n *= d;
      want += n;
    }
    int64_t total = 0;
    for (const auto& u : units) {
      for (const auto& p : u.params) total += p.numel();
    }
    EXPECT_EQ(total, want);
    EXPECT_LT(total, llama::parameter_count(c));
    EXPECT_EQ(units[0].tp_all_reduces, 1);
    EXPECT_EQ(units[1].tp_all_reduces, 2);
    EXPECT_EQ(units[1].tp_all_reduce_bytes, 2 * 32 * c.hidden_size * 4);
    // The layer keeps its heads' and its MLP chunk's activations: less than the whole layer's.
    llama::PlanShape whole{c, 32, 2, 4, checkpointed};
    EXPECT_LT(units[1].activation_bytes, llama::plan_units(whole)[1].activation_bytes);

    fsdp::plan::PlanRequest r;
    r.units = units;
    r.layout = {4, 1, 0, /*tp=*/2};
    auto plan = fsdp::plan::make_plan(r);
    const fsdp::plan::CollectivePlan* tp = nullptr;
    for (const auto& col : plan.collectives) {
      if (col.group == "tp") tp = &col;
    }
    ASSERT_NE(tp, nullptr);
    EXPECT_EQ(tp->ranks, 2);
    // The root (not checkpointed) forward and backward; two layers, recomputed when checkpointed.
    EXPECT_EQ(tp->calls_per_step, 2 * 1 + 2 * 2 * (checkpointed ? 3 : 2));
    EXPECT_EQ(plan.collectives[0].ranks, 2);  // FSDP gathers over the 2 data-parallel ranks
  }
  expect_error_containing<InvalidArgument>(
      [&] {
        llama::plan_units(llama::PlanShape{c, 32, 2, 4, false, 4});
      },
      "degree of 4");
}

// The search over layouts: every choice fits, divides the world, keeps TP within a host and
// divides the heads; the fastest first.
TEST(LlamaPlan, LayoutSearchRanksTheLayoutsThatFit) {
  auto c = *llama::preset_config("llama3-70b");
  const int64_t capacity = int64_t{141} << 30;
  auto request_for = [&](const fsdp::plan::Layout& l) {
    llama::PlanShape shape{c, 8192, 1, 2, true, l.tp};
    fsdp::plan::PlanRequest r;
    r.units = llama::plan_units(shape);
    r.dtypes = {4, 2, 4};
    r.transient_bytes = llama::loss_transient_bytes(c, 8192) / l.tp;
    r.comm = fsdp::plan::CommModel::links(350e9, 45e9, 20e-6);
    return r;
  };
  auto best = fsdp::plan::search_layouts(64, 8, 64, request_for, capacity, 5);
  ASSERT_FALSE(best.empty());
  for (size_t i = 0; i < best.size(); ++i) {
    const auto& l = best[i].layout;
    EXPECT_EQ(l.replicas * l.shards() * l.tp, 64);
    EXPECT_EQ(8 % l.tp, 0);
    EXPECT_EQ(c.num_key_value_heads % l.tp, 0);
    EXPECT_LE(best[i].plan.memory.total, capacity);
    if (i > 0) {
      EXPECT_GE(best[i].plan.comm_seconds_per_step, best[i - 1].plan.comm_seconds_per_step);
    }
  }
  std::cout << fsdp::plan::format_layouts(best);
}

// Start-up without the full model: sharding each layer as it is built (rank 0 of 8, the fake
// group), the peak of live tensor bytes is the root's full parameters, one full layer and the
// shards, not the model.
TEST(LlamaPlan, ShardingAsBuiltNeverHoldsTheModel) {
  llama::Config c = tiny_llama();
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  const int world = 8;
  auto pg = make_fake_group(/*rank=*/0, world);
  const int64_t model_bytes = 4 * llama::parameter_count(c);
  const int64_t root_bytes = 4 * (2 * c.vocab_size * c.hidden_size + c.hidden_size);
  const int64_t layer_bytes = (model_bytes - root_bytes) / c.num_hidden_layers;
  reset_host_tensor_peak();
  const int64_t before = allocated();
  llama::BuildOptions o;
  o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) { fully_shard(layer, pg); };
  auto model = llama::build_llama(c, o);
  fully_shard(model, pg);
  const int64_t peak = host_tensor_memory().peak - before;
  const int64_t kept = allocated() - before;
  std::cout << "model " << model_bytes << " B; start-up peak " << peak << " B, kept " << kept
            << " B (rank 0 of " << world << ")\n";
  // Rows of rank 0 (ceil of each dim 0 over 8), the layers' shards and the root's.
  EXPECT_LE(kept, model_bytes / world * 11 / 10);
  EXPECT_LE(peak, root_bytes + layer_bytes + model_bytes / world * 11 / 10);
  EXPECT_LT(peak, model_bytes / 2);
}

}  // namespace
}  // namespace fsdp::testing
