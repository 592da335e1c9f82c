#include "base_model.h"

#include <caffe2/serialize/crc_alt.h>  // libtorch's CRC-32
#include <dirent.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "fsdp/errors.h"

namespace llama {
namespace {

uint32_t add(uint32_t crc, const std::string& bytes) {
  return crc32_fast(bytes.data(), bytes.size(), crc);
}

// The file's size, first and last MiB: enough to tell two checkpoints of one architecture apart
// without reading gigabytes.
uint32_t add_file(uint32_t crc, const std::string& path, bool ends_only) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw fsdp::IoError(fmt::format("{}: cannot be read", path));
  const auto size = static_cast<int64_t>(in.tellg());
  crc = add(crc, std::to_string(size));
  constexpr int64_t kMiB = 1 << 20;
  auto read = [&](int64_t offset, int64_t n) {
    std::string buf(static_cast<size_t>(n), '\0');
    in.seekg(offset);
    in.read(buf.data(), n);
    if (!in) throw fsdp::IoError(fmt::format("{}: cannot be read", path));
    return buf;
  };
  if (!ends_only || size <= 2 * kMiB) return add(crc, read(0, size));
  return add(add(crc, read(0, kMiB)), read(size - kMiB, kMiB));
}

std::vector<std::string> safetensors_files(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

BaseModel base_model(const Options& o) {
  uint32_t crc = 0;
  std::string what;
  if (!o.hf_dir.empty()) {
    crc = add_file(crc, o.hf_dir + "/config.json", false);
    const auto files = safetensors_files(o.hf_dir);
    for (const auto& name : files) crc = add_file(add(crc, name), o.hf_dir + "/" + name, true);
    what = fmt::format("--hf-dir {} ({} weight file{})", o.hf_dir, files.size(),
                       files.size() == 1 ? "" : "s");
  } else if (!o.config.empty()) {
    crc = add(add_file(crc, o.config, false), std::to_string(o.train.seed));
    what = fmt::format("--config {} --seed {}", o.config, o.train.seed);
  } else {
    crc = add(add(crc, o.preset), std::to_string(o.train.seed));
    what = fmt::format("--preset {} --seed {}", o.preset, o.train.seed);
  }
  return {fmt::format("crc32:{:08x}", crc), what};
}

}  // namespace llama
