#include "fsdp/comm/agree.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace fsdp {

std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& mine) {
  const int world = pg.size();
  auto on = at::TensorOptions().device(pg.device());
  auto length = at::full({1}, static_cast<int64_t>(mine.size()), on.dtype(at::kLong));
  auto lengths = at::empty({world}, on.dtype(at::kLong));
  pg.all_gather(lengths, length)->wait();
  auto sizes = lengths.to(at::kCPU);
  const int64_t longest = std::max<int64_t>(1, sizes.max().item<int64_t>());
  auto bytes = at::zeros({longest}, at::kByte);
  if (!mine.empty()) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  auto all = at::empty({world * longest}, on.dtype(at::kByte));
  pg.all_gather(all, bytes.to(on.device()))->wait();
  auto host = all.to(at::kCPU);
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const char* at_r = reinterpret_cast<const char*>(host.data_ptr<uint8_t>()) + r * longest;
    out.emplace_back(at_r, static_cast<size_t>(sizes[r].item<int64_t>()));
  }
  return out;
}

std::string agreed_failures(ProcessGroup& pg, const std::string& what,
                            const std::function<void()>& fn) {
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
    // An empty message still marks this rank as failed.
    if (error.empty()) error = "an exception without a message";
  } catch (...) {
    error = "unknown error";
  }
  auto all = all_gather_strings(pg, error);
  std::string message;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty())
      message += fmt::format("{}rank {}: {}", message.empty() ? "" : "; ", r, all[r]);
  }
  return message.empty() ? message : fmt::format("{}: {}", what, message);
}

}  // namespace fsdp
