#include "comm/mpi/mpi_runtime.h"

#include <cstdio>
#include <mutex>
#include <thread>

namespace fsdp::detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, len);
}

std::shared_ptr<MpiRuntime> MpiRuntime::acquire() {
  static std::mutex mu;
  static std::weak_ptr<MpiRuntime> current;
  std::lock_guard<std::mutex> lock(mu);
  if (auto rt = current.lock()) return rt;

  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw CommError("mpi", "init", -1, -1,
                    "MPI was already finalised in this process (all MPI groups were destroyed); "
                    "MPI cannot be initialised twice");
  }
  std::shared_ptr<MpiRuntime> rt(new MpiRuntime());
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    FSDP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "init", -1,
                   -1);
    rt->initialised_here_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  rt->thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  current = rt;
  return rt;
}

void MpiRuntime::abort_job_later(const std::string& reason, std::chrono::milliseconds grace) {
  if (broken_.exchange(true)) return;
  std::fprintf(stderr, "%s\n", reason.c_str());
  std::fflush(stderr);
  // Detached: it must not keep the process alive, and the process may end before it wakes.
  std::thread([grace] {
    std::this_thread::sleep_for(grace);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }).detach();
}

MpiRuntime::~MpiRuntime() {
  if (broken_) {
    // MPI_Finalize would wait for the stuck collective forever.
    MPI_Abort(MPI_COMM_WORLD, 1);
    return;
  }
  if (!initialised_here_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();  // a destructor never throws; nothing to report to
}

}  // namespace fsdp::detail
