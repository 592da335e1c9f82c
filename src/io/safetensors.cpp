#include "fsdp/io/safetensors.h"

#include <fmt/ranges.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp {
namespace {

// The format is little-endian; so are the machines this library builds for (x86-64, aarch64).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

// A header larger than this is not a weights file (safetensors' own reader caps it at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const std::map<std::string, at::ScalarType>& dtype_by_name() {
  static const std::map<std::string, at::ScalarType> m = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return m;
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [name, type] : dtype_by_name()) {
    if (type == t) return name;
  }
  throw InvalidArgument(
      fmt::format("safetensors: dtype {} has no safetensors name", c10::toString(t)));
}

[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  throw FormatError(fmt::format("safetensors file {}: {}", path, what));
}

}  // namespace

namespace {

// The header of a file holding `specs` in order, checked before any file is touched: 8 bytes of
// length, then the JSON padded so that the data starts 8-byte aligned.
std::string safetensors_header(const std::string& path,
                               const std::vector<SafetensorsWriter::Spec>& specs,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& spec : specs) {
    FSDP_CHECK_ARG(!spec.name.empty() && spec.name != "__metadata__",
                   "write_safetensors({}): invalid tensor name '{}'", path, spec.name);
    FSDP_CHECK_ARG(names.insert(spec.name).second, "write_safetensors({}): tensor '{}' given twice",
                   path, spec.name);
    uint64_t bytes = c10::elementSize(spec.dtype);
    for (auto d : spec.shape) bytes *= static_cast<uint64_t>(d);
    header[spec.name] = {{"dtype", dtype_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + json;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Spec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : SafetensorsWriter(path, safetensors_header(path, specs, metadata), std::move(specs)) {}

// `specs` by reference: the delegating constructor reads it for the header in the same
// argument list, so it must not be moved from until here.
SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::string& header,
                                     std::vector<Spec>&& specs)
    : specs_(std::move(specs)), out_(path) {
  out_.write(header);
}

void SafetensorsWriter::write_next(const at::Tensor& tensor) {
  FSDP_CHECK_ARG(next_ < specs_.size(), "write_safetensors({}): more tensors than declared",
                 out_.path());
  const Spec& spec = specs_[next_];
  FSDP_CHECK_ARG(tensor.scalar_type() == spec.dtype && tensor.sizes().vec() == spec.shape,
                 "write_safetensors({}): tensor '{}' is {} {}, declared {} {}", out_.path(),
                 spec.name, c10::toString(tensor.scalar_type()), tensor.sizes(),
                 c10::toString(spec.dtype), spec.shape);
  auto cpu = tensor.detach().to(at::kCPU).contiguous();
  out_.write(cpu.data_ptr(), static_cast<size_t>(cpu.numel() * cpu.element_size()));
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != specs_.size()) {
    throw Error(fmt::format("write_safetensors({}): {} of {} tensors written", out_.path(), next_,
                            specs_.size()));
  }
  out_.close();
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& [name, tensor] : tensors) {
    specs.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const auto& item : tensors) writer.write_next(item.second);
  writer.finish();
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
  SafetensorsIndex index;
  auto* metadata = &index.metadata;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InvalidArgument(fmt::format("safetensors: cannot open {}", path));
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  if (file_size < sizeof(n))
    malformed(path, fmt::format("{} bytes, shorter than the 8-byte header length", file_size));
  in.read(reinterpret_cast<char*>(&n), sizeof(n));
  if (n > kMaxHeaderBytes || n > file_size - sizeof(n)) {
    malformed(path,
              fmt::format("header length {} does not fit the file of {} bytes", n, file_size));
  }
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    malformed(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) malformed(path, "header is not a JSON object");
  const uint64_t data_size = file_size - sizeof(n) - n;

  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) malformed(path, "__metadata__ is not an object");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string())
          malformed(path, fmt::format("__metadata__ value of '{}' is not a string", k));
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string& tensor = name;  // a lambda may not capture a structured binding (C++17)
    auto bad = [&](const std::string& what) {
      malformed(path, fmt::format("tensor '{}': {}", tensor, what));
    };
    if (!info.is_object()) bad("entry is not an object");
    if (!info.contains("dtype") || !info["dtype"].is_string()) bad("no dtype");
    auto dt = dtype_by_name().find(info["dtype"].get<std::string>());
    if (dt == dtype_by_name().end()) bad(fmt::format("unsupported dtype {}", info["dtype"].dump()));
    if (!info.contains("shape") || !info["shape"].is_array()) bad("no shape");
    Entry e{name, dt->second, {}, 0, 0};
    uint64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned())
        bad(fmt::format("shape {} has a dimension that is not a non-negative integer",
                        info["shape"].dump()));
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const auto& offsets = info.contains("data_offsets") ? info["data_offsets"] : nlohmann::json();
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      bad("data_offsets is not [begin, end]");
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const uint64_t bytes = numel * c10::elementSize(e.dtype);
    if (e.end < e.begin || e.end - e.begin != bytes) {
      bad(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}", e.begin,
                      e.end, e.end - e.begin, info["shape"].dump(),
                      info["dtype"].get<std::string>(), bytes));
    }
    if (e.end > data_size) {
      bad(fmt::format("data_offsets end {} is past the data region of {} bytes (truncated file?)",
                      e.end, data_size));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });

  const uint64_t data_start = sizeof(n) + n;
  for (const auto& e : entries) {
    index.entries.push_back({e.name, e.dtype, e.shape, data_start + e.begin, e.end - e.begin});
  }
  return index;
}

NamedTensors read_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata) {
  auto index = read_safetensors_index(path);
  if (metadata) *metadata = index.metadata;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("safetensors: cannot open {}", path));
  NamedTensors out;
  out.reserve(index.entries.size());
  for (const auto& e : index.entries) {
    auto t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    in.seekg(static_cast<std::streamoff>(e.offset));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.nbytes));
    if (!in)
      malformed(path, fmt::format("tensor '{}': reading its {} bytes failed", e.name, e.nbytes));
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

at::Tensor read_safetensors_rows(const std::string& path, const SafetensorsEntry& entry,
                                 int64_t row_begin, int64_t row_end) {
  auto shape = entry.shape;
  const int64_t rows = shape.empty() ? 1 : shape[0];
  FSDP_CHECK_ARG(0 <= row_begin && row_begin <= row_end && row_end <= rows,
                 "read_safetensors_rows({}): rows [{}, {}) of tensor '{}' with {} rows", path,
                 row_begin, row_end, entry.name, rows);
  if (!shape.empty()) shape[0] = row_end - row_begin;
  auto t = at::empty(shape, at::TensorOptions().dtype(entry.dtype));
  const int64_t row_bytes = rows == 0 ? 0 : static_cast<int64_t>(entry.nbytes) / rows;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("safetensors: cannot open {}", path));
  in.seekg(static_cast<std::streamoff>(entry.offset + row_begin * row_bytes));
  in.read(static_cast<char*>(t.data_ptr()),
          static_cast<std::streamsize>((row_end - row_begin) * row_bytes));
  if (!in)
    malformed(path, fmt::format("tensor '{}': reading rows {}..{} failed", entry.name, row_begin,
                                row_end));
  return t;
}

void load_safetensors_into(torch::nn::Module& module, const std::string& path) {
  auto file = read_safetensors(path);
  std::map<std::string, at::Tensor> by_name(file.begin(), file.end());
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : module.named_parameters()) targets[item.key()] = item.value();
  for (const auto& item : module.named_buffers()) targets[item.key()] = item.value();
  // Check everything before changing anything.
  for (const auto& [name, target] : targets) {
    auto it = by_name.find(name);
    FSDP_CHECK_ARG(it != by_name.end(),
                   "load_safetensors_into: {} has no tensor '{}' (the module's)", path, name);
    FSDP_CHECK_ARG(it->second.sizes() == target.sizes(),
                   "load_safetensors_into: tensor '{}' has shape {} in {}, the module expects {}",
                   name, it->second.sizes(), path, target.sizes());
  }
  for (const auto& [name, tensor] : by_name) {
    FSDP_CHECK_ARG(targets.count(name),
                   "load_safetensors_into: {} holds '{}', which the module does not have", path,
                   name);
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) target.copy_(by_name.at(name));
}

}  // namespace fsdp
