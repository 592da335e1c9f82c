#include "checkpoint/manifest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint.h"

namespace fsdp::detail {
namespace {

constexpr const char* kFormat = "fsdp-cpp sharded checkpoint";
constexpr int kFormatVersion = 1;

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  return names;
}

}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& [type, name] : dtype_names()) {
    if (type == t) return name;
  }
  throw CheckpointError(fmt::format("checkpoint: dtype {} cannot be stored", c10::toString(t)));
}

int64_t row_bytes(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n * static_cast<int64_t>(c10::elementSize(dtype));
}

std::string manifest_to_json(const Manifest& m) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : m.tensors) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : t.rows) {
      rows.push_back({{"rank", r.rank},
                      {"file", r.file},
                      {"rows", {r.row_begin, r.row_end}},
                      {"offset", r.offset},
                      {"nbytes", r.nbytes},
                      {"chunk_rows", r.chunk_rows},
                      {"crc32", r.crc32}});
    }
    tensors.push_back(
        {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"stored", rows}});
  }
  nlohmann::json j = {{"format", kFormat},
                      {"version", kFormatVersion},
                      {"library_version", m.library_version},
                      {"world_size", m.world_size},
                      {"step", m.step},
                      {"metadata", m.metadata},
                      {"optimizer", m.optimizer},
                      {"optimizer_steps", m.optimizer_steps},
                      {"tensors", tensors}};
  return j.dump(1);
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  auto fail = [&](const std::string& what) {
    return CheckpointError(fmt::format("checkpoint manifest {}: {}", path, what));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw fail(fmt::format("not valid JSON ({})", e.what()));
  }
  Manifest m;
  std::string where = "the header";
  try {
    if (j.at("format").get<std::string>() != kFormat) throw fail("not an fsdp-cpp checkpoint");
    const int version = j.at("version").get<int>();
    if (version != kFormatVersion) {
      throw fail(fmt::format("format version {}, this library reads {}", version, kFormatVersion));
    }
    m.library_version = j.at("library_version").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.step = j.at("step").get<int64_t>();
    m.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    m.optimizer = j.at("optimizer").get<std::string>();
    m.optimizer_steps = j.at("optimizer_steps").get<std::map<std::string, int64_t>>();
    if (m.world_size < 1) throw fail(fmt::format("world_size {} < 1", m.world_size));
    for (const auto& jt : j.at("tensors")) {
      StoredTensor t;
      t.name = jt.at("name").get<std::string>();
      where = fmt::format("tensor '{}'", t.name);
      const auto dtype = jt.at("dtype").get<std::string>();
      bool known = false;
      for (const auto& [type, name] : dtype_names()) {
        if (dtype == name) t.dtype = type, known = true;
      }
      if (!known) throw fail(fmt::format("{} has unknown dtype '{}'", where, dtype));
      t.shape = jt.at("shape").get<std::vector<int64_t>>();
      const int64_t total_rows = t.shape.empty() ? 1 : t.shape[0];
      const int64_t rb = row_bytes(t.shape, t.dtype);
      for (const auto& jr : jt.at("stored")) {
        StoredRows r;
        r.rank = jr.at("rank").get<int>();
        r.file = jr.at("file").get<std::string>();
        auto rows = jr.at("rows").get<std::vector<int64_t>>();
        if (rows.size() != 2) throw fail(fmt::format("{}: rows must be [begin, end]", where));
        r.row_begin = rows[0];
        r.row_end = rows[1];
        r.offset = jr.at("offset").get<int64_t>();
        r.nbytes = jr.at("nbytes").get<int64_t>();
        r.chunk_rows = jr.at("chunk_rows").get<int64_t>();
        r.crc32 = jr.at("crc32").get<std::vector<uint32_t>>();
        const int64_t n = r.row_end - r.row_begin;
        if (r.row_begin < 0 || n < 0 || r.row_end > total_rows || r.offset < 0 ||
            r.nbytes != n * rb || r.chunk_rows < 1 ||
            static_cast<int64_t>(r.crc32.size()) != (n + r.chunk_rows - 1) / r.chunk_rows ||
            r.file.empty() || r.file.find('/') != std::string::npos) {
          throw fail(
              fmt::format("{}: inconsistent stored rows of rank {} in {}", where, r.rank, r.file));
        }
        t.rows.push_back(std::move(r));
      }
      m.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    throw fail(fmt::format("{}: {}", where, e.what()));
  }
  return m;
}

}  // namespace fsdp::detail
