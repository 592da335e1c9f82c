// Profiling a sharded step with libtorch's own (Kineto) profiler: a Chrome/Perfetto trace per
// rank, an operator table like torch.profiler's key_averages().table(), and FSDP's
// communication figures read from the trace.
//
// FSDP's phases and collectives are named ranges in that profiler, on the thread where they
// run: on the training thread fsdp::pre_forward, fsdp::post_forward, fsdp::pre_backward,
// fsdp::post_backward, fsdp::end_of_backward, fsdp::all_gather (issue, with
// fsdp::all_gather_copy_in), fsdp::all_gather_wait, fsdp::all_gather_copy_out,
// fsdp::reduce_scatter (issue, with fsdp::reduce_scatter_copy_in), fsdp::reduce_scatter_wait,
// fsdp::reduce_scatter_copy_out, fsdp::recompute; on a CPU backend's communication thread
// fsdp::comm::all_gather, fsdp::comm::reduce_scatter, fsdp::comm::all_reduce, ... (with the
// collective's size in bytes as the range's input), and on GPU around each NCCL launch;
// fsdp::optimizer::adamw around FusedAdamW's kernel (with the bytes it moves).
// The unit-level ranges carry the unit's name in the root, as FSDP2's do:
// "fsdp::pre_forward (layers.0)", likewise post_forward, pre_backward, post_backward,
// all_gather, all_gather_wait, reduce_scatter, reduce_scatter_wait. Builds with the GPU
// backend also emit every range as an NVTX range (Nsight Systems, `ncu --nvtx`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp {

struct OpStats {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0;   // time in the op itself, not in ops it called (CPU)
  double total_ms = 0;  // including them
};

struct ProfileSummary {
  std::vector<OpStats> ops;  // by self time, largest first
  // Device activity (GPU kernels and copies; empty on CPU), by device time, largest first:
  // self_ms and total_ms are both the kernels' device time.
  std::vector<OpStats> device_ops;
  int64_t threads = 0;  // threads with events
  double span_ms = 0;   // first event's start to last event's end
  // The three figures below come from the device when the trace holds NCCL kernels
  // (device_figures), else from the host's ranges.
  // Host: time the training threads (those running FSDP's phases: on CUDA the backward runs on
  // autograd's device thread) spent in operators, less the time they waited for collectives.
  // Device: time kernels other than NCCL's ran (their union over streams).
  double compute_ms = 0;
  // Host: time the communication thread spent in collectives (fsdp::comm::* ranges).
  // Device: time NCCL's kernels ran.
  double comm_ms = 0;
  // Exposed communication. Host: time the training threads waited for collectives
  // (fsdp::*_wait ranges), the trainer's "exposed comm" over the same steps. Device: time NCCL's
  // kernels ran while no other kernel did (a CUDA wait() does not block the host).
  double exposed_comm_ms = 0;
  // 1 - exposed / comm: the share of communication hidden behind compute (0 when none).
  double overlap = 0;
  // Calls of each fsdp:: range, by its name without the unit ("fsdp::all_gather_wait").
  std::map<std::string, int64_t> fsdp_counts;
  // Time the training threads waited for each unit's all-gather and reduce-scatter, by unit
  // name ("layers.0"; "(root)"); units that never waited are absent. With hybrid sharding the
  // reduce-scatter wait includes the all-reduce across replicas that follows it. Host time: on
  // CUDA it is the cost of queueing the wait, not the stall (see exposed_comm_ms).
  std::map<std::string, double> all_gather_wait_ms, reduce_scatter_wait_ms;
  // compute_ms, comm_ms and exposed_comm_ms were measured on the device. (Declared last, so
  // that 0.1.0's members keep their order.)
  bool device_figures = false;
};

struct ProfileOptions {
  // Record every operator's input shapes and dtypes, and the FLOPs of matmuls
  // (torch.profiler's record_shapes and with_flops): what scripts/roofline.py needs. Costs
  // some step time while recording (bench/RESULTS.md); nothing when not recording.
  bool record_shapes = true;
};

// Starts recording on this thread (and on the communication threads of CPU process groups,
// which join by themselves), with CUDA activity when libtorch has CUDA and a device is present.
// Throws Error when a profiler is already running. Stop it on every path out, an error's too
// (ProfilingScope does): a profiler still running when the process exits crashes libtorch's
// teardown (SIGSEGV in its static destructors), so an error's exit status became 139.
void start_profiling(const ProfileOptions& options = {});
// Stops, writes the Chrome trace (JSON, opens in Perfetto and chrome://tracing) to
// `trace_path` when it is not empty, and summarises the events. Throws IoError, the profiler
// stopped, when the trace cannot be written (naming the path and the system's reason).
ProfileSummary stop_profiling(const std::string& trace_path);

// start_profiling for a scope: destroyed before stop() (an error left the scope), it stops the
// profiler and drops what it recorded.
class ProfilingScope {
 public:
  explicit ProfilingScope(const ProfileOptions& options = {});
  ~ProfilingScope();
  ProfilingScope(const ProfilingScope&) = delete;
  ProfilingScope& operator=(const ProfilingScope&) = delete;
  // stop_profiling(trace_path). Once: Error when already stopped.
  ProfileSummary stop(const std::string& trace_path);

 private:
  bool running_ = true;
};

// The `top` operators by self time as a text table: name, calls, self ms, total ms, self %;
// then, when the trace has device activity, the `top` kernels by device time.
std::string format_op_table(const ProfileSummary& summary, int top = 15);
// Each unit's all-gather and reduce-scatter wait as a text table, largest all-gather wait first.
std::string format_unit_waits(const ProfileSummary& summary);

}  // namespace fsdp
