// ops::float8_all_gather on thread ranks against its definition: the parameters kept in the
// compute dtype arrive exactly, the float8 ones as the cast of the whole parameter (every
// rank's shard cast with the whole's scale) divided by that scale, the scales reported are the
// whole parameters', the bytes moved are float8_all_gather_bytes plus 4 per float8 parameter;
// float8_linear given the gathered scale and weight computes what it computes on the whole
// weight, bit for bit (fp32 and bf16), and ignores a scale that is not the weight's; bad masks.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "fsdp/comm/local_group.h"
#include "fsdp/errors.h"
#include "fsdp/ops/float8.h"
#include "fsdp/ops/float8_all_gather.h"
#include "support/torch_api.h"

namespace fsdp::testing::float8_all_gather_test {
namespace {

// Three parameters of a unit, whole (rows, cols): a norm-like vector, a weight and another.
struct Params {
  std::vector<at::Tensor> whole;
  std::vector<bool> float8{false, true, true};
};

Params make_params(at::ScalarType dtype) {
  torch::manual_seed(9);
  Params p;
  p.whole.push_back((torch::rand({10}) + 0.5).to(dtype));
  p.whole.push_back((torch::randn({7, 16}) * 0.05).to(dtype));
  auto big = torch::randn({5, 32}) * 0.3;
  big[4][3] = 2.5;  // the largest magnitude on the last rank's rows at worlds 2 and 3
  p.whole.push_back(big.to(dtype));
  return p;
}

// Rank r's rows of `t` padded to ceil(rows / world) rows (layout.h's dim-0 shard), flat.
at::Tensor shard_of(const at::Tensor& t, int world, int r) {
  const int64_t rows = t.size(0), per = (rows + world - 1) / world;
  const int64_t row_numel = t.numel() / rows;
  auto out = at::zeros({per * row_numel}, t.options());
  const int64_t begin = std::min(rows, r * per), end = std::min(rows, begin + per);
  if (end > begin)
    out.narrow(0, 0, (end - begin) * row_numel).copy_(t.narrow(0, begin, end - begin).reshape(-1));
  return out;
}

void check_world(int world, at::ScalarType dtype) {
  const auto p = make_params(dtype);
  std::mutex mu;
  run_local_ranks(world, [&](const ProcessGroupPtr& group) {
    const int r = group->rank();
    std::vector<at::Tensor> shards;
    std::vector<int64_t> offsets, lengths;
    int64_t numel = 0;
    for (const auto& t : p.whole) {
      shards.push_back(shard_of(t, world, r));
      offsets.push_back(numel);
      lengths.push_back(shards.back().numel());
      numel += shards.back().numel();
    }
    auto input = at::cat(shards);
    auto output = at::empty({world * numel}, input.options());
    std::vector<at::Tensor> scales(p.whole.size());
    ops::Float8AllGatherOptions o;
    o.float8 = p.float8;
    o.on_scale = [&](size_t i, const at::Tensor& s) { scales[i] = s.clone(); };
    const auto before = group->stats().bytes_of(CollectiveKind::kAllGather);
    auto hook = ops::float8_all_gather(o);
    auto work = hook(output, input, *group, offsets);
    ASSERT_NE(work, nullptr);
    work->wait();
    const auto sent = group->stats().bytes_of(CollectiveKind::kAllGather) - before;
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(sent, ops::float8_all_gather_bytes(lengths, p.float8, input.element_size()) + 4 * 2)
        << "world " << world;
    auto out = output.view({world, numel});
    for (size_t i = 0; i < p.whole.size(); ++i) {
      if (!p.float8[i]) {
        EXPECT_FALSE(scales[i].defined());
      } else {
        const auto whole8 = ops::to_float8(p.whole[i], at::kFloat8_e4m3fn);
        ASSERT_TRUE(scales[i].defined());
        EXPECT_TRUE(scales[i].equal(whole8.scale)) << "parameter " << i << " world " << world;
      }
      for (int q = 0; q < world; ++q) {
        auto got = out[q].narrow(0, offsets[i], lengths[i]);
        at::Tensor want = shard_of(p.whole[i], world, q);
        if (p.float8[i]) {
          const auto whole8 = ops::to_float8(p.whole[i], at::kFloat8_e4m3fn);
          const auto deq = (whole8.data.to(at::kFloat) / whole8.scale).to(dtype);
          want = shard_of(deq, world, q);
          EXPECT_FALSE(got.equal(shard_of(p.whole[i], world, q)));  // rounded: float8 was on
        }
        EXPECT_TRUE(got.equal(want)) << "parameter " << i << " from rank " << q << " world "
                                     << world << " " << c10::toString(dtype);
      }
    }
  });
}

TEST(Float8AllGather, GathersTheWholeParametersCastAndTheOthersExactly) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int world : {1, 2, 3}) check_world(world, dtype);
  }
}

TEST(Float8AllGather, SendsAboutHalfOfBf16sBytes) {
  // A layer's shapes: 4 Linears of 256 x 256 in float8 and two norms of 256 in bf16.
  std::vector<int64_t> lengths{256, 65536, 65536, 65536, 65536, 256};
  std::vector<bool> float8{false, true, true, true, true, false};
  const int64_t bf16 = 2 * (4 * 65536 + 512);
  const int64_t f8 = ops::float8_all_gather_bytes(lengths, float8, 2);
  EXPECT_EQ(f8, 4 * 65536 + 2 * 512);
  EXPECT_LT(static_cast<double>(f8) / bf16, 0.51);
}

TEST(Float8AllGather, TheLinearOnTheGatheredWeightIsTheLinearOnTheWholeOne) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    torch::manual_seed(3);
    auto weight = (torch::randn({48, 32}) * 0.07).to(dtype);
    auto x = torch::randn({6, 32}).to(dtype);
    const auto w8 = ops::to_float8(weight, at::kFloat8_e4m3fn);
    const auto gathered = (w8.data.to(at::kFloat) / w8.scale).to(dtype);
    const auto want = ops::float8_linear(x, weight, {});
    EXPECT_TRUE(ops::float8_linear(x, gathered, {}, w8.scale).equal(want)) << c10::toString(dtype);
    // And the backward's gradient of the input (the weight cast with the forward's scale).
    auto dy = torch::randn({6, 48}).to(dtype);
    auto xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
    ops::float8_linear(xa, weight, {}).backward(dy);
    ops::float8_linear(xb, gathered, {}, w8.scale).backward(dy);
    EXPECT_TRUE(xa.grad().equal(xb.grad())) << c10::toString(dtype);
    // A scale that is not the weight's is not used (the weight's own is).
    EXPECT_TRUE(ops::float8_linear(x, weight, {}, w8.scale * 3).equal(want));
  }
}

TEST(Float8AllGather, RefusesMasksThatDoNotFitTheUnit) {
  EXPECT_THROW(ops::float8_all_gather({{false, false}, {}}), InvalidArgument);
  auto hook = ops::float8_all_gather({{true, false}, {}});
  run_local_ranks(1, [&](const ProcessGroupPtr& group) {
    auto input = torch::randn({12});
    auto output = torch::empty({12});
    EXPECT_THROW(hook(output, input, *group, {0, 4, 8}), InvalidArgument);  // 3 parameters
  });
}

}  // namespace
}  // namespace fsdp::testing::float8_all_gather_test
