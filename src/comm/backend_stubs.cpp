// Definitions for the engines this build was configured without: they say so clearly.
#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"

namespace fsdp {
namespace {
[[maybe_unused]] [[noreturn]] void missing(const char* engine, const char* option) {
  throw UnsupportedError(fmt::format(
      "this build of fsdp has no {} backend (configure with {}=ON and its dependency installed)",
      engine, option));
}
}  // namespace

#ifndef FSDP_HAVE_MPI
bool has_mpi_backend() { return false; }
ProcessGroupPtr make_mpi_world_group(std::chrono::milliseconds) { missing("MPI", "FSDP_WITH_MPI"); }
#endif

#ifndef FSDP_HAVE_GLOO
bool has_gloo_backend() { return false; }
ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                std::chrono::milliseconds) {
  missing("Gloo", "FSDP_WITH_GLOO");
}
#endif

#ifndef FSDP_HAVE_NCCL
bool has_nccl_backend() { return false; }
std::string nccl_version() { return ""; }
std::vector<uint8_t> make_nccl_unique_id() { missing("NCCL", "FSDP_WITH_NCCL"); }
ProcessGroupPtr make_nccl_group(int, int, int, const std::vector<uint8_t>&,
                                std::chrono::milliseconds) {
  missing("NCCL", "FSDP_WITH_NCCL");
}
#endif

}  // namespace fsdp
