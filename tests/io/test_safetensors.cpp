// safetensors: round trip of every dtype, metadata, loading into a module, and clean errors for
// malformed files (each names the file and what is wrong). Python's safetensors reads what we
// write and we read what it writes: tests/reference/fsdp2_parity.py (its weights) and
// tests/io/safetensors_interop.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fsdp/errors.h"
#include "fsdp/io/files.h"
#include "fsdp/io/safetensors.h"
#include "support/expect_error.h"
#include "support/torch_api.h"

namespace fsdp {
namespace {

std::string scratch_dir() {
  return std::filesystem::temp_directory_path().string() + "/fsdp_st_" + std::to_string(::getpid());
}

std::string temp_path(const std::string& name) {
  io::make_directories(scratch_dir());
  return scratch_dir() + "/" + name;
}

// Removes the files the tests wrote, once they all ran.
class RemoveScratchDir : public ::testing::Environment {
 public:
  void TearDown() override { io::remove_tree(scratch_dir()); }
};
const auto* const remove_scratch_dir = ::testing::AddGlobalTestEnvironment(new RemoveScratchDir);

// The call throws Exception, and its message contains every needle.
template <typename Exception, typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> needles) {
  for (const auto& needle : needles) testing::expect_error_containing<Exception>(fn, needle);
}

void write_raw(const std::string& path, const std::string& header, const std::string& data = "") {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out << header << data;
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  NamedTensors in;
  for (auto dtype : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt,
                     at::kShort, at::kChar, at::kByte, at::kBool}) {
    in.emplace_back(std::string("t_") + c10::toString(dtype),
                    (torch::arange(12) % 5).to(dtype).reshape({3, 4}));
  }
  in.emplace_back("empty", torch::empty({0, 7}));
  in.emplace_back("scalar", torch::tensor(3.5));
  auto path = temp_path("all.safetensors");
  write_safetensors(path, in, {{"step", "42"}});
  std::map<std::string, std::string> meta;
  auto out = read_safetensors(path, &meta);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type()) << in[i].first;
    EXPECT_TRUE(at::equal(out[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(meta.at("step"), "42");
}

TEST(Safetensors, LoadsIntoAModuleOnlyWhenEverythingMatches) {
  torch::nn::Linear a(4, 3), b(4, 3);
  auto path = temp_path("linear.safetensors");
  write_safetensors(path, {{"weight", a->weight}, {"bias", a->bias}});
  load_safetensors_into(*b, path);
  EXPECT_TRUE(at::equal(a->weight, b->weight));

  torch::nn::Linear c(4, 5);
  auto before = c->weight.clone();
  // The first mismatch in name order: bias [3] in the file, [5] in the module.
  expect_error<InvalidArgument>([&] { load_safetensors_into(*c, path); },
                                {"'bias'", "shape [3]", "expects [5]"});
  EXPECT_TRUE(at::equal(before, c->weight));  // nothing changed
  write_safetensors(path, {{"weight", a->weight}});
  expect_error<InvalidArgument>([&] { load_safetensors_into(*b, path); }, {"no tensor 'bias'"});
  write_safetensors(path, {{"weight", a->weight}, {"bias", a->bias}, {"extra", a->bias}});
  expect_error<InvalidArgument>([&] { load_safetensors_into(*b, path); }, {"'extra'"});
}

TEST(Safetensors, RejectsMalformedFilesNamingWhatIsWrong) {
  auto path = temp_path("bad.safetensors");
  auto expect_format_error = [&](std::initializer_list<std::string> needles) {
    expect_error<FormatError>([&] { read_safetensors(path); }, needles);
  };
  { std::ofstream(path) << "abc"; }
  expect_format_error({path, "shorter than the 8-byte header length"});
  write_raw(path, "{}");
  std::filesystem::resize_file(path, 6);
  expect_format_error({"shorter"});
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  expect_format_error({"header length", "does not fit"});
  write_raw(path, "{not json");
  expect_format_error({"not valid JSON"});
  write_raw(path, "[1, 2]");
  expect_format_error({"not a JSON object"});
  write_raw(path, R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", "abcd");
  expect_format_error({"tensor 'w'", "unsupported dtype"});
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "abcd");
  expect_format_error({"tensor 'w'", "shape"});
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "abcd");
  expect_format_error({"tensor 'w'", "needs 8"});
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "abcd");
  expect_format_error({"tensor 'w'", "past the data region", "truncated"});
  write_raw(path, R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd");
  expect_format_error({"tensor 'w'", "data_offsets"});
  write_raw(path, R"({"__metadata__": {"k": 1}})");
  expect_format_error({"__metadata__"});
  expect_error<InvalidArgument>([&] { read_safetensors(temp_path("missing")); }, {"cannot open"});
}

TEST(Safetensors, RejectsBadNamesOnWrite) {
  auto t = torch::ones({2});
  expect_error<InvalidArgument>(
      [&] {
        write_safetensors(temp_path("dup"), {{"a", t}, {"a", t}});
      },
      {"'a' given twice"});
  expect_error<InvalidArgument>(
      [&] {
        write_safetensors(temp_path("meta"), {{"__metadata__", t}});
      },
      {"invalid tensor name"});
}

}  // namespace
}  // namespace fsdp
