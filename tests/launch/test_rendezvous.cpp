// The rendezvous over a real TCPStore, ranks as threads of this process: rank 0 hosts the server
// and drops it as soon as share_over_store returns, as init_from_env does with NCCL's unique id
// (issue 24, item 2), while the other ranks arrive late, one after another.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/launch/rendezvous.h"

namespace fsdp {
namespace {

// A port nobody listens on now (the kernel's choice for a socket bound to port 0).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

LaunchInfo rank_of(int rank, int world, int port) {
  LaunchInfo l;
  l.launcher = Launcher::kTorchrun;
  l.rank = l.local_rank = rank;
  l.world_size = world;
  l.master_addr = "127.0.0.1";
  l.master_port = port;
  return l;
}

std::vector<uint8_t> pattern() {
  std::vector<uint8_t> v(128);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(7 * i + 3);
  return v;
}

TEST(Rendezvous, LateRanksReadRankZerosBytesAfterItReturned) {
  constexpr int kWorld = 4;
  const int port = free_port();
  ASSERT_GT(port, 0);
  const auto timeout = std::chrono::seconds(30);
  std::vector<std::vector<uint8_t>> got(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      try {
        // Rank 0 first; the others one after another, well after it has set the value.
        std::this_thread::sleep_for(std::chrono::milliseconds(300 * r));
        auto store = connect_store(rank_of(r, kWorld, port), timeout);
        got[r] = share_over_store(*store, "blob", r, kWorld,
                                  r == 0 ? pattern() : std::vector<uint8_t>{}, timeout);
        // The store (rank 0: the server) is dropped here, at once.
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], pattern()) << "rank " << r;
  }
}

TEST(Rendezvous, RankZeroFailsNamingWhoDidNotRead) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  // A world of three in which rank 2 never comes: rank 1 reads, rank 0 gives up after the
  // timeout with a CommError that counts the readers.
  std::string error0;
  std::vector<uint8_t> got1;
  std::thread rank0([&] {
    try {
      auto store = connect_store(rank_of(0, 3, port), std::chrono::seconds(30));
      share_over_store(*store, "blob", 0, 3, pattern(), std::chrono::milliseconds(1500));
    } catch (const CommError& e) {
      error0 = e.what();
    }
  });
  std::string error1;
  std::thread rank1([&] {
    try {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto store = connect_store(rank_of(1, 3, port), std::chrono::seconds(30));
      got1 = share_over_store(*store, "blob", 1, 3, {}, std::chrono::seconds(30));
    } catch (const std::exception& e) {
      error1 = e.what();
    }
  });
  rank1.join();
  rank0.join();
  EXPECT_EQ(error1, "");
  EXPECT_EQ(got1, pattern());
  EXPECT_NE(error0.find("share 'blob'"), std::string::npos) << error0;
  EXPECT_NE(error0.find("1 of the 2 other ranks read it"), std::string::npos) << error0;
}

TEST(Rendezvous, ConnectWithoutMasterAddrIsALaunchError) {
  EXPECT_THROW(connect_store(LaunchInfo{}, std::chrono::seconds(1)), LaunchError);
}

}  // namespace
}  // namespace fsdp
