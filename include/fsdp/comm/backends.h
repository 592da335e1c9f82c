// Constructors of the real engines. Most programs call fsdp::init_from_env() (launch.h)
// instead; these are for programs that set up communication themselves.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace fsdp {

// Which engines this build of the library carries.
bool has_mpi_backend();
bool has_nccl_backend();
bool has_gloo_backend();

// The NCCL library this process runs with (ncclGetVersion: the loaded libnccl, not the headers
// built against), e.g. "2.28.9"; "" when built without NCCL. Worth logging: NCCL bugs are
// version-specific (ncclAvg on one rank before 2.29.7, for one).
std::string nccl_version();

// MPI over MPI_COMM_WORLD (a duplicate), CPU tensors, for processes started by mpirun.
// Initialises MPI (MPI_THREAD_MULTIPLE) on first use unless the program already did, and
// finalises it when the last MPI group is destroyed if it initialised it.
// A wait on a collective that has not completed `timeout` after it was issued (a peer died,
// hangs or stopped issuing collectives) throws CommError naming the operation and the time
// waited; MPI cannot cancel the collective, so the job is then aborted (MPI_Abort) when the
// process destroys its MPI groups or 10 s later, whichever is first. 0: wait forever.
// Every rank's last MPI group meets the others' on its way out, before MPI_Finalize. One
// destroyed while an exception propagates (the process leaves on an error) waits there at most
// 3 s: when the others arrive (they raised the same error, or are done) MPI is finalised;
// otherwise MPI is left unfinalised and the job ends when this process exits (mpirun does
// that; under other launchers MPI_Abort at exit), instead of the others waiting out their
// timeout. Only where this library initialised MPI.
// Throws UnsupportedError when built without MPI, CommError when MPI fails.
ProcessGroupPtr make_mpi_world_group(std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Gloo through libtorch's c10d, CPU tensors: the engine for torchrun-style launches on CPU.
// `store` is the rendezvous (a TCPStore in init_from_env). Interface: GLOO_SOCKET_IFNAME if set,
// else the host name's address, falling back to loopback.
ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                int world_size, std::chrono::milliseconds timeout);

// NCCL, CUDA tensors, one rank per GPU. `unique_id` is the bytes of an ncclUniqueId created by
// rank 0 (make_nccl_unique_id) and handed to every rank by the caller (init_from_env uses MPI
// or the TCP store: share_over_store). Throws UnsupportedError when built without NCCL.
// The communicator is created non-blocking: when a peer does not join within `timeout` (it died
// before its init) this throws TimeoutError instead of waiting forever. A watchdog thread aborts
// the communicator when a collective has not completed `timeout` after it was issued (a dead or
// stuck peer), failed on the GPU (its CUDA error becomes the cause), or NCCL reports an
// asynchronous error; waits and later collectives then throw CommError with the cause.
// 0: no watchdog, and no limit on the initialisation.
// Destroyed while an exception propagates (the process leaves on an error), the group aborts
// its communicator first (a process's aborts wait at most 10 s in all), so that neither its
// collectives nor finalising wait for peers that will never come.
// Collectives run on the group's own stream after the caller's current stream; wait() orders
// the caller's stream after them. The group keeps a collective's tensors until a wait() on the
// stream that was current when it was issued (buffers allocated there may be reused by that
// stream at once), or until it completes.
// Debugging aid: FSDP_DEBUG_COMM_DELAY_MS=N (read when the group is made) holds every
// collective back N ms on its stream, so that a missing stream wait shows on one GPU as wrong
// results rather than a rare race.
std::vector<uint8_t> make_nccl_unique_id();
ProcessGroupPtr make_nccl_group(int rank, int world_size, int device,
                                const std::vector<uint8_t>& unique_id,
                                std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace fsdp
