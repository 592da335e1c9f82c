#include "fsdp/launch/rendezvous.h"

#include <fmt/format.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdp/errors.h"

namespace fsdp {

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout) {
  if (launch.master_addr.empty()) {
    throw LaunchError(
        fmt::format("a TCP rendezvous is needed for this backend under {}, but MASTER_ADDR and "
                    "MASTER_PORT are not set",
                    launcher_name(launch.launcher)));
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(launch.master_port);
  opts.isServer = !launch.use_agent_store && launch.rank == 0;
  opts.numWorkers =
      launch.use_agent_store ? c10::nullopt : c10::optional<std::size_t>(launch.world_size);
  opts.waitWorkers = false;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
  } catch (const std::exception& e) {
    throw CommError("tcp_store", "connect", launch.rank, launch.world_size,
                    fmt::format("{}:{}: {}", launch.master_addr, launch.master_port, e.what()));
  }
  if (launch.use_agent_store) {
    // torchrun's own convention for worker keys inside the agent's store.
    store = c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("/worker/attempt_{}", launch.restart_count), store);
  }
  return c10::make_intrusive<c10d::PrefixStore>("fsdp", store);
}

std::vector<uint8_t> share_over_store(c10d::Store& store, const std::string& key, int rank,
                                      int world_size, const std::vector<uint8_t>& bytes,
                                      std::chrono::milliseconds timeout) {
  const std::string op = fmt::format("share '{}'", key);
  if (world_size == 1) return bytes;
  auto read_key = [&](int r) { return fmt::format("{}/read/{}", key, r); };
  if (rank == 0) {
    try {
      store.set(key, bytes);
    } catch (const std::exception& e) {
      throw CommError("tcp_store", op, rank, world_size, e.what());
    }
    // Rank 0 usually hosts the server: returning (and dropping the store) before everyone has
    // read would take the value away from ranks that arrive late. Each reader leaves a receipt.
    std::vector<std::string> receipts;
    for (int r = 1; r < world_size; ++r) receipts.push_back(read_key(r));
    try {
      store.wait(receipts, timeout);
    } catch (const std::exception& e) {
      int read = 0;
      for (const auto& k : receipts) read += store.check({k}) ? 1 : 0;
      throw CommError(
          "tcp_store", op, rank, world_size,
          fmt::format("{} of the {} other ranks read it within {} ms (a rank died, or did not "
                      "reach the rendezvous): {}",
                      read, world_size - 1, timeout.count(), e.what()));
    }
    return bytes;
  }
  std::vector<uint8_t> value;
  try {
    store.wait({key}, timeout);
    value = store.get(key);
    store.set(read_key(rank), std::vector<uint8_t>{1});
  } catch (const std::exception& e) {
    throw CommError(
        "tcp_store", op, rank, world_size,
        fmt::format("rank 0's value did not arrive within {} ms: {}", timeout.count(), e.what()));
  }
  return value;
}

}  // namespace fsdp
