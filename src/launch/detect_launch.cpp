#include <cerrno>
#include <cstdlib>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"

namespace fsdp {
namespace {

class Env {
 public:
  explicit Env(const EnvLookup& lookup) : lookup_(lookup) {}

  const char* raw(const char* name) const {
    const char* v = lookup_ ? lookup_(name) : std::getenv(name);
    return (v && *v) ? v : nullptr;
  }
  bool has(const char* name) const { return raw(name) != nullptr; }

  // An integer variable in [lo, hi]; `what` says which launcher set it, for the message.
  int integer(const char* name, long lo, long hi, const char* what) const {
    const char* v = raw(name);
    if (!v) {
      throw LaunchError(fmt::format("{} is not set; {} expects it", name, what));
    }
    errno = 0;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0') {
      throw LaunchError(fmt::format("{}='{}' is not an integer ({})", name, v, what));
    }
    if (x < lo || x > hi) {
      throw LaunchError(fmt::format("{}={} is out of range: expected {} <= {} <= {} ({})", name, x,
                                    lo, name, hi, what));
    }
    return static_cast<int>(x);
  }

  int integer_or(const char* name, int fallback, long lo, long hi, const char* what) const {
    return has(name) ? integer(name, lo, hi, what) : fallback;
  }

 private:
  const EnvLookup& lookup_;
};

constexpr long kMaxRanks = 1 << 20;

void read_rank_and_size(const Env& env, LaunchInfo& info, const char* rank_var,
                        const char* size_var, const char* local_var, const char* what) {
  info.world_size = env.integer(size_var, 1, kMaxRanks, what);
  info.rank = env.integer(rank_var, 0, info.world_size - 1, what);
  info.local_rank = env.integer_or(local_var, info.rank, 0, info.world_size - 1, what);
}

void read_master(const Env& env, LaunchInfo& info, const char* what) {
  if (info.world_size == 1 && !env.has("MASTER_ADDR")) return;  // nothing to rendezvous with
  const char* addr = env.raw("MASTER_ADDR");
  if (!addr) {
    throw LaunchError(fmt::format(
        "MASTER_ADDR is not set; {} with WORLD_SIZE={} needs MASTER_ADDR and MASTER_PORT for "
        "the rendezvous (scripts/launch.sh sets them)",
        what, info.world_size));
  }
  info.master_addr = addr;
  info.master_port = env.integer("MASTER_PORT", 1, 65535, what);
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kSingle:
      return "single";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kMpirun:
      return "mpirun";
    case Launcher::kSlurm:
      return "slurm";
  }
  return "unknown";
}

LaunchInfo detect_launch(const EnvLookup& getenv) {
  Env env(getenv);
  LaunchInfo info;
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    const char* what =
        "a torchrun-style launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
        "MASTER_PORT)";
    info.launcher = Launcher::kTorchrun;
    read_rank_and_size(env, info, "RANK", "WORLD_SIZE", "LOCAL_RANK", what);
    read_master(env, info, what);
    const char* agent = env.raw("TORCHELASTIC_USE_AGENT_STORE");
    info.use_agent_store = agent && std::string(agent) == "True";
    info.restart_count = env.integer_or("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30, what);
  } else if (env.has("OMPI_COMM_WORLD_SIZE")) {
    info.launcher = Launcher::kMpirun;
    read_rank_and_size(env, info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK", "an Open MPI launch");
  } else if (env.has("PMI_SIZE")) {
    info.launcher = Launcher::kMpirun;
    read_rank_and_size(env, info, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "a PMI launch");
  } else if (env.has("SLURM_NTASKS") && env.has("SLURM_PROCID")) {
    const char* what = "a Slurm launch (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)";
    info.launcher = Launcher::kSlurm;
    read_rank_and_size(env, info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", what);
    // With MASTER_ADDR/PORT exported by the batch script, ranks meet over TCP; without them
    // srun must provide MPI (srun --mpi=pmix).
    if (env.has("MASTER_ADDR")) read_master(env, info, what);
  }
  return info;
}

}  // namespace fsdp
