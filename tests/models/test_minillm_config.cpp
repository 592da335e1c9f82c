// MiniLLM's float8 configuration is refused by name where it cannot run, before any weight is
// made: a rowwise recipe or float8 attention with float8 off (the trainer's refusals have their
// shell test; these are the library's own), and a width whose GEMMs are not multiples of 16. A
// valid configuration (float8 rowwise on the attention too) builds.
#include <gtest/gtest.h>

#include <string>

#include "fsdp/errors.h"
#include "fsdp/models/minillm.h"
#include "support/torch_api.h"

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
  c.float8_scaling = ops::Float8Scaling::tensorwise;
  c.float8_attention = true;
  EXPECT_NE(refusal(c).find("float8_attention but float8 is off"), std::string::npos) << refusal(c);
  c.float8 = true;
  c.float8_scaling = ops::Float8Scaling::rowwise;
  EXPECT_EQ(refusal(c), "");
  c.dim = 24;  // 24 x 96: not multiples of 16
  c.heads = 2;
  EXPECT_NE(refusal(c).find("multiples of 16"), std::string::npos) << refusal(c);
}

}  // namespace
}  // namespace fsdp::testing
