// Shared by the Llama tests: a tiny config whose sizes divide by nothing, scratch directories,
// building models one at a time on thread ranks, and comparing parameters bit for bit.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_config.h"
#include "support/torch_api.h"

namespace fsdp::testing {

namespace llama = fsdp::models::llama;

// vocab 1001, hidden 56 (head size 14), 4 heads over 2 key/value heads, intermediate 90: row
// counts that 2, 3 and 4 ranks split unevenly.
inline llama::Config tiny_llama(bool tied = false) {
  llama::Config c;
  c.vocab_size = 1001;
  c.hidden_size = 56;
  c.intermediate_size = 90;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.1;  // logits that vary (0.02 gives nearly uniform ones)
  return c;
}

// Thread ranks share libtorch's global generator: one model built at a time.
inline std::mutex& llama_build_mutex() {
  static std::mutex mu;
  return mu;
}

inline llama::LlamaForCausalLM build_seeded(const llama::Config& c, uint64_t seed,
                                            llama::BuildOptions options = {}) {
  std::lock_guard<std::mutex> lock(llama_build_mutex());
  torch::manual_seed(seed);
  return llama::build_llama(c, options);
}

// A fresh directory path under /tmp (not created), unique in this process.
inline std::string scratch_path(const std::string& what) {
  static std::atomic<int> n{0};
  return "/tmp/fsdp_test_" + what + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
}

inline void remove_all(const std::string& path) {
  // No std::filesystem: libtorch 2.11 exports broken copies of it (docs/libtorch.md).
  const std::string cmd = "rm -rf '" + path + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
}

inline std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> names;
  const std::string cmd = "ls -1 '" + path + "' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  char line[4096];
  while (p && std::fgets(line, sizeof(line), p)) {
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    names.push_back(s);
  }
  if (p) ::pclose(p);
  return names;
}

// Every tensor of a full state dict bit for bit (dtype, shape and bytes).
inline void expect_same_tensors(const FullStateDict& got, const FullStateDict& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(got[i].second.scalar_type() == want[i].second.scalar_type() &&
                got[i].second.sizes() == want[i].second.sizes() &&
                torch::equal(got[i].second, want[i].second))
        << got[i].first << " differs";
  }
}

}  // namespace fsdp::testing
