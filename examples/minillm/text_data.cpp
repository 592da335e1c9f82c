#include "text_data.h"

#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

#include "fsdp/data/token_file.h"

namespace minillm {
namespace {

// The token files' counter-based draw (fsdp/data/token_file.h): sample i of step s needs
// no state, and both trainers share the rule.
uint64_t draw(uint64_t seed, int step, int64_t index) {
  return fsdp::data::draw(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(index));
}

class TextDataset final : public Dataset {
 public:
  TextDataset(std::string path, std::vector<uint8_t> bytes, int64_t seq, uint64_t seed)
      : path_(std::move(path)), bytes_(std::move(bytes)), seq_(seq), seed_(seed) {}

  Batch slice(int step, int64_t first, int64_t count) const override {
    auto tokens = torch::empty({count, seq_}, torch::kLong);
    auto targets = torch::empty({count, seq_}, torch::kLong);
    auto* t = tokens.data_ptr<int64_t>();
    auto* y = targets.data_ptr<int64_t>();
    const uint64_t starts = bytes_.size() - seq_;  // valid starts: [0, size - seq - 1]
    for (int64_t i = 0; i < count; ++i) {
      uint64_t start = draw(seed_, step, first + i) % starts;
      for (int64_t j = 0; j < seq_; ++j) {
        t[i * seq_ + j] = bytes_[start + j];
        y[i * seq_ + j] = bytes_[start + j + 1];
      }
    }
    return {tokens, targets};
  }

  std::string describe() const override {
    return fmt::format("text {} ({} bytes)", path_, bytes_.size());
  }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  int64_t seq_;
  uint64_t seed_;
};

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t vocab, int64_t seq, uint64_t seed)
      : vocab_(vocab), seq_(seq), seed_(seed) {}

  Batch slice(int step, int64_t first, int64_t count) const override {
    auto tokens = torch::empty({count, seq_ + 1}, torch::kLong);
    auto* t = tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      uint64_t r = draw(seed_, step, first + i);
      int64_t start = static_cast<int64_t>(r % vocab_);
      int64_t stride = 1 + static_cast<int64_t>((r >> 32) % 7);
      for (int64_t j = 0; j <= seq_; ++j) t[i * (seq_ + 1) + j] = (start + j * stride) % vocab_;
    }
    return {tokens.narrow(1, 0, seq_).contiguous(), tokens.narrow(1, 1, seq_).contiguous()};
  }

  std::string describe() const override {
    return fmt::format("synthetic (strided counting modulo {})", vocab_);
  }

 private:
  int64_t vocab_, seq_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<Dataset> make_text_dataset(const std::string& path, int64_t seq, uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot open data file {}", path));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (static_cast<int64_t>(bytes.size()) < seq + 2) {
    throw std::runtime_error(fmt::format(
        "data file {} has {} bytes, fewer than one sequence of {} + 1", path, bytes.size(), seq));
  }
  return std::make_unique<TextDataset>(path, std::move(bytes), seq, seed);
}

std::unique_ptr<Dataset> make_synthetic_dataset(int64_t vocab, int64_t seq, uint64_t seed) {
  return std::make_unique<SyntheticDataset>(vocab, seq, seed);
}

}  // namespace minillm
