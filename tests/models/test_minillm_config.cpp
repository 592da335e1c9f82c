// MiniLLM's float8 configuration is refused by name where it cannot run, before any weight is
// made: a rowwise recipe with float8 off (the trainer's refusal, train_minillm --float8-recipe
// rowwise without --float8, has its shell test; this is the library's own), and a width whose
// feed-forward GEMMs are not multiples of 16. A valid configuration builds with float8 on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "fsdp/errors.h"
#include "fsdp/models/minillm.h"

namespace fsdp::testing {
namespace {

namespace mm = fsdp::models::minillm;

std::string refusal(const mm::Config& c) {
  try {
    mm::MiniLLM model(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(MiniLLMConfig, Float8IsRefusedByNameWhereItCannotRun) {
  mm::Config c;
  c.vocab = 64;
  c.dim = 32;
  c.layers = 1;
  c.heads = 2;
  c.float8_scaling = ops::Float8Scaling::rowwise;
  EXPECT_NE(refusal(c).find("rowwise scaling but float8 is off"), std::string::npos) << refusal(c);
  c.float8 = true;
  EXPECT_EQ(refusal(c), "");
  c.dim = 24;  // 24 x 96: not multiples of 16
  c.heads = 2;
  EXPECT_NE(refusal(c).find("multiples of 16"), std::string::npos) << refusal(c);
}

}  // namespace
}  // namespace fsdp::testing
