// The TCP rendezvous of a torchrun-style launch: the store every rank connects to, and handing
// one rank's bytes (NCCL's unique id) to every rank through it.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/launch/launch.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace fsdp {

// A c10d TCPStore at MASTER_ADDR:MASTER_PORT: rank 0 hosts the server unless torchrun's agent
// already runs it (LaunchInfo::use_agent_store; then every rank is a client under the agent's
// key prefix). Keys are prefixed "fsdp". The server lives as long as rank 0's returned store.
// Throws LaunchError when MASTER_ADDR is not set, CommError when connecting fails within
// `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout);

// Rank 0's `bytes` on every rank of a `world_size`-rank rendezvous on `store` (collective: every
// rank calls it with the same key; other ranks' `bytes` are ignored). Rank 0 returns only after
// every rank has read the value, so rank 0 may destroy its store (and with it the server it
// hosts) as soon as this returns, however late the other ranks arrive. Throws CommError naming
// the key when a rank cannot read it, or when rank 0 saw fewer than every rank read it within
// `timeout` (the message counts them).
std::vector<uint8_t> share_over_store(c10d::Store& store, const std::string& key, int rank,
                                      int world_size, const std::vector<uint8_t>& bytes,
                                      std::chrono::milliseconds timeout);

}  // namespace fsdp
