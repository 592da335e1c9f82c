#include "checkpoint/manifest.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::detail {
namespace {

constexpr const char* kFormat = "fsdp-cpp sharded checkpoint";
constexpr int kFormatVersion = 1;
// The CRC-32 of the manifest as written without this field (json.dump(1), keys sorted): a
// flipped bit in a step or an offset is an error, not a silently different checkpoint. Absent
// from the manifests written before it existed, which load as before.
constexpr const char* kCrcField = "manifest_crc32";

// An integer field, strictly: nlohmann's get<T> would convert a JSON float (undefined
// behaviour when it does not fit; found by fuzz/fuzz_manifest.cpp) or wrap an integer outside
// T's range. Throws nlohmann's type_error, which the caller reports with the entry's name.
template <typename T>
T integer(const nlohmann::json& v) {
  auto bad = [&](const char* what) {
    return nlohmann::json::type_error::create(302, std::string(what) + ", got " + v.dump(), &v);
  };
  if (!v.is_number_integer()) throw bad("expected an integer");
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw bad("integer too large");
    return static_cast<T>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      (sizeof(T) < sizeof(int64_t) && i > static_cast<int64_t>(std::numeric_limits<T>::max()))) {
    throw bad("integer out of range");
  }
  return static_cast<T>(i);
}

template <typename T>
std::vector<T> integers(const nlohmann::json& v) {
  if (!v.is_array()) {
    throw nlohmann::json::type_error::create(302, "expected an array, got " + v.dump(), &v);
  }
  std::vector<T> out;
  for (const auto& x : v) out.push_back(integer<T>(x));
  return out;
}

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
                      {"partial", m.partial},
                      {"tensors", tensors}};
  j[kCrcField] = checksum(j.dump(1));
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
    const int version = integer<int>(j.at("version"));
    if (version != kFormatVersion) {
      throw fail(fmt::format("format version {}, this library reads {}", version, kFormatVersion));
    }
    // After the version: another version may checksum another way.
    if (j.contains(kCrcField)) {
      const auto stored = integer<uint32_t>(j.at(kCrcField));
      j.erase(kCrcField);
      if (checksum(j.dump(1)) != stored) {
        throw fail("checksum mismatch: the manifest was changed or damaged after it was written");
      }
    }
    m.library_version = j.at("library_version").get<std::string>();
    m.world_size = integer<int>(j.at("world_size"));
    m.step = integer<int64_t>(j.at("step"));
    m.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    m.optimizer = j.at("optimizer").get<std::string>();
    // Absent from the checkpoints written before filters existed: those hold everything.
    m.partial = j.value("partial", false);
    for (const auto& [name, steps] : j.at("optimizer_steps").items()) {
      m.optimizer_steps[name] = integer<int64_t>(steps);
    }
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
      t.shape = integers<int64_t>(jt.at("shape"));
      // Every size below is computed in int64: dimensions must be non-negative and a row's
      // and the whole tensor's bytes must fit, or a hostile manifest overflows them.
      int64_t rb = static_cast<int64_t>(c10::elementSize(t.dtype)), all_bytes = 0;
      bool sizes_fit = true;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        sizes_fit = sizes_fit && t.shape[d] >= 0 &&
                    (d == 0 || !__builtin_mul_overflow(rb, t.shape[d], &rb));
      }
      const int64_t total_rows = t.shape.empty() ? 1 : t.shape[0];
      if (!sizes_fit || __builtin_mul_overflow(rb, total_rows, &all_bytes)) {
        throw fail(fmt::format("{}: shape has a negative or too large dimension", where));
      }
      for (const auto& jr : jt.at("stored")) {
        StoredRows r;
        r.rank = integer<int>(jr.at("rank"));
        r.file = jr.at("file").get<std::string>();
        auto rows = integers<int64_t>(jr.at("rows"));
        if (rows.size() != 2) throw fail(fmt::format("{}: rows must be [begin, end]", where));
        r.row_begin = rows[0];
        r.row_end = rows[1];
        r.offset = integer<int64_t>(jr.at("offset"));
        r.nbytes = integer<int64_t>(jr.at("nbytes"));
        r.chunk_rows = integer<int64_t>(jr.at("chunk_rows"));
        r.crc32 = integers<uint32_t>(jr.at("crc32"));
        // Rows inside the tensor first: then n * rb and the chunk count cannot overflow.
        const bool rows_inside =
            r.row_begin >= 0 && r.row_end >= r.row_begin && r.row_end <= total_rows;
        const int64_t n = rows_inside ? r.row_end - r.row_begin : 0;
        const int64_t chunks =
            r.chunk_rows >= 1 ? n / r.chunk_rows + (n % r.chunk_rows != 0 ? 1 : 0) : -1;
        if (!rows_inside || r.offset < 0 || r.nbytes != n * rb || r.chunk_rows < 1 ||
            static_cast<int64_t>(r.crc32.size()) != chunks || r.file.empty() ||
            r.file.find('/') != std::string::npos) {
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
