#include "comm/mpi/mpi_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace fsdp::detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, len);
}

namespace {

// Set when the runtime went without finalising MPI (leaving on an error, the others still
// running): MPI is then neither usable nor to be initialised again in this process.
std::atomic<bool> left_unfinalised{false};

// At exit, after the program has reported its error: ends every rank whatever launched them
// (srun, for one, ends a job whose rank exits with an error only with --kill-on-bad-exit).
void abort_job_at_exit() {
  std::fflush(nullptr);  // what the program printed last (its error) goes before the job does
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// Open MPI's mpirun (it sets OMPI_COMM_WORLD_SIZE) ends the job when a rank exits unfinalised
// with an error, with its usual one-paragraph report; its MPI_Abort report at exit was garbled
// once in six runs here (Open MPI 4.1: "ORTE_ERROR_LOG: Data unpack would read past end of
// buffer"). So under mpirun the unfinalised exit alone ends the job. FSDP_MPI_ABORT_AT_EXIT=1
// takes the other launchers' way under mpirun too: the only way to run that path in a test,
// since Open MPI's ranks cannot start without the variable.
bool launcher_ends_the_job() {
  const char* force = std::getenv("FSDP_MPI_ABORT_AT_EXIT");
  if (force != nullptr && std::string(force) == "1") return false;
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

}  // namespace

std::shared_ptr<MpiRuntime> MpiRuntime::acquire() {
  static std::mutex mu;
  static std::weak_ptr<MpiRuntime> current;
  std::lock_guard<std::mutex> lock(mu);
  if (auto rt = current.lock()) return rt;

  if (left_unfinalised) {
    throw CommError("mpi", "init", -1, -1,
                    "this process left MPI on an error while other ranks still ran (its MPI "
                    "groups were destroyed as the error propagated); the job is being ended");
  }
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
    // Collective, as every caller of acquire() is (the world group's own MPI_Comm_dup follows).
    FSDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &rt->leave_comm_), "init", -1, -1);
    MPI_Comm_set_errhandler(rt->leave_comm_, MPI_ERRORS_RETURN);
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

bool MpiRuntime::every_rank_leaves(std::optional<std::chrono::milliseconds> wait) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (leave_comm_ == MPI_COMM_NULL || MPI_Ibarrier(leave_comm_, &request) != MPI_SUCCESS) {
    return false;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + wait.value_or(std::chrono::milliseconds::zero());
  for (;;) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    // Left pending: the caller then leaves MPI alone, unfinalised.
    if (wait && std::chrono::steady_clock::now() >= deadline) return false;
    // Polled with a nap, not MPI_Wait (Open MPI's spins a core while a slower rank finishes).
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
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
  if (finalized) return;
  // Every rank passes the leave-together barrier on its way out, so that a rank leaving on an
  // error meets the others there when they are done too, and all finalise. A rank leaving as
  // usual waits for the others, as MPI_Finalize would; one leaving on an error waits a little.
  const bool on_error = std::uncaught_exceptions() > 0;
  if (!every_rank_leaves(on_error ? std::optional(kLeaveTogether) : std::nullopt) && on_error) {
    // The others still run (or wait in a collective this rank will never issue): finalising
    // would hold this process until their timeout. Unfinalised, and aborted at exit (once the
    // program has reported its error), this process ends the job.
    left_unfinalised = true;
    const bool abort_at_exit = !launcher_ends_the_job();
    if (abort_at_exit) std::atexit(abort_job_at_exit);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fprintf(stderr,
                 "[mpi rank %d/%d] fsdp: leaving on an error while other ranks still run: the "
                 "job ends when this process exits%s, so that they do not wait out their "
                 "timeout\n",
                 rank, size, abort_at_exit ? " (MPI_Abort at exit)" : "");
    std::fflush(stderr);
    return;
  }
  if (leave_comm_ != MPI_COMM_NULL) MPI_Comm_free(&leave_comm_);
  MPI_Finalize();  // a destructor never throws; nothing to report to
}

}  // namespace fsdp::detail
