// One rank misbehaves after a first barrier; the others keep issuing all-reduces and must end
// in bounded time, never hang. Run under mpirun or scripts/launch.sh (tests/comm/failure_modes.sh).
//   failing_rank MODE TIMEOUT_S
// MODE, for the last rank:
//   stuck  stops issuing collectives (sleeps 300 s) and stays alive: survivors must raise
//          CommError within the group's timeout (TIMEOUT_S);
//   throw  throws out of its work, past the group's scope; main reports it and returns 1, as a
//          trainer does: the job must end at once, before the survivors' timeout;
//   exit   leaves quietly with status 0 in the middle of the run;
//   kill   is SIGKILLed;
//   desync issues an all-gather where the others all-reduce (run with FSDP_DEBUG_DESYNC=1:
//          every rank must raise CommError naming the divergent collective);
//   late   throws after the last of 5 collectives, while the others end as usual: they print
//          "rank R: finished" after their group is gone, and all finalise together;
//   all    (every rank) throws the same error at the 4th collective, as an agreed verdict
//          does: all of them report it, and all finalise together;
//   pending issues its 4th all-reduce and throws without waiting for it, while the others are
//          still busy (60 s) before theirs: its group goes with that collective in flight.
// Survivors that raise print "rank R: CommError after S s: WHAT" and return 3; one whose
// collectives never fail returns 1. A rank whose error left its groups' scope prints "rank R:
// error: WHAT (reported S s after it was raised)" and returns 1. Tensors live on the launch's
// device: under FSDP_BACKEND=nccl (scripts/gpu_check.sh) on the rank's GPU.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "fsdp/fsdp.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// When this rank raised its error (misbehave), for main's report of how long leaving took.
std::chrono::steady_clock::time_point g_raised;

void misbehave(const std::string& mode) {
  if (mode == "stuck") std::this_thread::sleep_for(std::chrono::seconds(300));
  if (mode == "throw" || mode == "all") {
    g_raised = std::chrono::steady_clock::now();
    throw std::runtime_error("failing_rank: this rank's step failed");
  }
  if (mode == "exit") std::_Exit(0);
  if (mode == "kill") std::raise(SIGKILL);
}

// This rank, for main's message (the group is gone by then).
int g_rank = -1;

// The ranks' work. Survivors catch CommError here, their group still alive (a broken MPI group
// aborts the job when it goes). Any other error leaves this function, so that the group is
// destroyed while the error propagates, as in a trainer whose main catches it outside the scope
// that holds the group: the library must then end the job at once, not after the survivors'
// timeout.
int run(const std::string& mode, int timeout_s) {
  fsdp::InitOptions options;
  options.timeout = std::chrono::seconds(timeout_s);
  auto d = fsdp::init_from_env(options);
  const int rank = d.group->rank(), last = d.group->size() - 1;
  g_rank = rank;
  d.group->barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  const bool ends = mode == "late" || mode == "all";  // after 5 collectives
  try {
    for (int i = 0; seconds_since(t0) < 120 && !(ends && i == 5); ++i) {
      if ((rank == last || mode == "all") && i == 3) misbehave(mode);
      auto t = at::ones({4096}, at::TensorOptions().device(d.device));
      if (mode == "pending" && i == 3) {
        if (rank != last) std::this_thread::sleep_for(std::chrono::seconds(60));  // still busy
        if (rank == last) {
          auto in_flight = d.group->all_reduce(t, fsdp::ReduceOp::kSum);  // not waited for
          misbehave("throw");
        }
      }
      if (rank == last && i == 3 && mode == "desync") {
        d.group->all_gather(at::empty({4096 * d.group->size()}, t.options()), t)->wait();
      } else {
        d.group->all_reduce(t, fsdp::ReduceOp::kSum)->wait();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const fsdp::CommError& e) {
    std::cout << "rank " << rank << ": CommError after " << seconds_since(t0) << " s: " << e.what()
              << std::endl;
    return 3;
  }
  if (ends) {
    if (rank == last && mode == "late") misbehave("throw");
    return 0;
  }
  std::cout << "rank " << rank << ": collectives did not fail in 120 s" << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: failing_rank stuck|throw|exit|kill|desync|late|all|pending TIMEOUT_S\n";
    return 2;
  }
  try {
    const int status = run(argv[1], std::atoi(argv[2]));
    // After the group is gone: a rank ending as usual is not cut short by one leaving on an
    // error (late).
    if (status == 0) std::cout << "rank " << g_rank << ": finished" << std::endl;
    return status;
  } catch (const std::exception& e) {
    // After the groups are gone: how long leaving took (an NCCL group that waited for its
    // peers instead of aborting would take the timeout).
    std::cout << "rank " << g_rank << ": error: " << e.what() << " (reported "
              << seconds_since(g_raised) << " s after it was raised)" << std::endl;
    return 1;
  }
}
