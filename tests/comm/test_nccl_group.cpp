// NCCL at world size 1 on a real GPU: collectives on CUDA tensors, the buffers a wait releases,
// the stream stall a timed wait measures, reductions in 16-bit dtypes, initialisation without
// the peer, and init_from_env's current device. Compiled and linked wherever the CUDA toolkit
// and NCCL are; skips without a GPU.
#include <ATen/Context.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "fsdp/comm/backends.h"
#include "fsdp/comm/wait_clock.h"
#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"
#include "fsdp/runtime/comm_hooks.h"
#include "support/gpu.h"

namespace fsdp {
namespace {

#define SKIP_WITHOUT_GPU() FSDP_SKIP_WITHOUT_GPU()

// A one-rank NCCL group whose collectives reach NCCL (the engine under test here), as a group
// of several ranks' would; FSDP's one-rank groups answer locally (OneRankAnswersLocally).
ProcessGroupPtr engine_group(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id(), timeout);
  pg->set_one_rank_through_engine(true);
  return pg;
}

at::TensorOptions cuda(at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().device(at::kCUDA, 0).dtype(dtype);
}

TEST(NcclGroup, WorldOfOneOnCuda) {
  SKIP_WITHOUT_GPU();
  auto pg = engine_group();
  EXPECT_EQ(pg->device(), at::Device(at::kCUDA, 0));
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    auto in = at::arange(7, cuda(dtype));
    auto out = at::empty({7}, cuda(dtype));
    pg->all_gather(out, in)->wait();
    EXPECT_TRUE(at::equal(out.cpu(), in.cpu()));
    pg->reduce_scatter(out, in, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(at::equal(out.cpu(), in.cpu()));
    auto t = in.clone();
    pg->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(at::equal(t.cpu(), in.cpu()));
    pg->broadcast(t, 0)->wait();
    EXPECT_TRUE(at::equal(t.cpu(), in.cpu()));
  }
  pg->barrier()->wait();
}

TEST(NcclGroup, RejectsCpuTensors) {
  SKIP_WITHOUT_GPU();
  auto pg = engine_group();
  EXPECT_THROW(pg->all_reduce(at::ones({2}), ReduceOp::kSum), Error);
}

// Item 7: a bf16 reduction moves bf16 (what the counters count), in the dtype asked.
TEST(NcclGroup, Bf16ReducesInBf16) {
  SKIP_WITHOUT_GPU();
  auto pg = engine_group();
  auto in = at::full({1024}, 1.5, cuda(at::kBFloat16));
  auto out = at::empty({1024}, cuda(at::kBFloat16));
  pg->reduce_scatter(out, in, ReduceOp::kAvg)->wait();
  EXPECT_EQ(pg->stats().bytes_of(CollectiveKind::kReduceScatter), 1024 * 2);
  EXPECT_TRUE(at::equal(out.cpu(), in.cpu()));
}

// Item 3: the group lets go of a collective's tensors at a wait on the issuing stream, not
// when its watchdog sees the collective finish; a wait on another stream keeps them.
TEST(NcclGroup, WaitOnIssuingStreamReleasesTheTensors) {
  SKIP_WITHOUT_GPU();
  auto pg = engine_group();
  auto in = at::ones({1 << 20}, cuda());
  auto out = at::empty({1 << 20}, cuda());
  auto work = pg->all_gather(out, in);
  EXPECT_EQ(in.use_count(), 2);  // ours and the group's
  work->wait();
  EXPECT_EQ(in.use_count(), 1);
  EXPECT_EQ(out.use_count(), 1);

  auto other = c10::cuda::getStreamFromPool();
  work = pg->all_gather(out, in);
  {
    c10::cuda::CUDAStreamGuard guard(other);
    work->wait();
  }
  EXPECT_EQ(in.use_count(), 2);  // its memory belongs to the first stream, which did not wait
  work.reset();
  c10::cuda::device_synchronize();
}

// Item 6: a timed wait measures the caller's stream stall. With every collective held back
// 50 ms on its stream (the debugging switch) and nothing else queued, the stream must stall at
// least that long: a lower bound the device enforces, not a speed.
TEST(NcclGroup, TimedWaitMeasuresTheStreamStall) {
  SKIP_WITHOUT_GPU();
  setenv("FSDP_DEBUG_COMM_DELAY_MS", "50", 1);
  auto pg = engine_group();
  unsetenv("FSDP_DEBUG_COMM_DELAY_MS");
  auto in = at::ones({1024}, cuda());
  auto out = at::empty({1024}, cuda());
  c10::cuda::device_synchronize();
  WaitClock clock;
  pg->all_gather(out, in)->wait_timed(clock);
  const double stalled = clock.seconds();  // blocks until the stream passed the wait
  std::cout << "stream stalled " << stalled * 1e3 << " ms behind a 50 ms delayed all-gather\n";
  EXPECT_GE(stalled, 0.045);
  EXPECT_TRUE(at::equal(out.cpu(), in.cpu()));     // and the result is right, late as it was
  EXPECT_EQ(static_cast<double>(clock), stalled);  // read again: the same, nothing pending
}

// Item 5: without its peer, initialisation ends in a TimeoutError instead of blocking forever.
TEST(NcclGroup, InitWithoutThePeerTimesOut) {
  SKIP_WITHOUT_GPU();
  try {
    make_nccl_group(0, 2, 0, make_nccl_unique_id(), std::chrono::seconds(3));
    FAIL() << "rank 0 of 2 initialised alone";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("did not join"), std::string::npos) << e.what();
  }
}

// Issue 31, item 1: a one-rank group never calls NCCL (ncclAvg on one rank left the last
// elements unprocessed, NVIDIA/nccl issue 1950): odd sizes average to themselves exactly, and
// the collective is complete at once.
TEST(NcclGroup, OneRankAnswersLocally) {
  SKIP_WITHOUT_GPU();
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  for (int64_t n : {1, 7, 1023, (1 << 20) + 5}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      auto in = at::randn({n}, cuda(dtype));
      auto out = at::full({n}, -1.0, cuda(dtype));
      auto work = pg->reduce_scatter(out, in, ReduceOp::kAvg);
      EXPECT_TRUE(work->is_completed());
      work->wait();
      EXPECT_TRUE(at::equal(out.cpu(), in.cpu())) << n;
    }
  }
}

// Issue 31, item 7: a collective issued while the current stream is captured into a CUDA graph
// is refused by name (a captured collective would replay without its event and watchdog).
TEST(NcclGroup, RefusesStreamCapture) {
  SKIP_WITHOUT_GPU();
  auto pg = engine_group();
  auto t = at::ones({16}, cuda());
  c10::cuda::device_synchronize();
  auto side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(side);
  ASSERT_EQ(cudaStreamBeginCapture(side.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  try {
    pg->all_reduce(t, ReduceOp::kSum);
    ADD_FAILURE() << "a captured all_reduce was accepted";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos)
        << e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(side.stream(), &graph);
  if (graph) cudaGraphDestroy(graph);
}

// Item 1: init_from_env makes the rank's GPU the current device.
TEST(NcclGroup, InitFromEnvSetsTheCurrentDevice) {
  SKIP_WITHOUT_GPU();
  InitOptions options;
  options.backend = Backend::kNccl;
  options.device = DeviceChoice::kCuda;  // ctest sets FSDP_DEVICE=cpu for the CPU suites
  const int last = static_cast<int>(at::getNumGPUs()) - 1;
  LaunchInfo launch;
  launch.local_rank = last;  // the highest GPU: not the default current device when > 0
  auto d = init_from_launch(launch, options);
  EXPECT_EQ(d.device, at::Device(at::kCUDA, last));
  EXPECT_EQ(c10::cuda::current_device(), last);
  EXPECT_EQ(d.group->device(), d.device);
  c10::cuda::set_device(0);
}

// Issue 39, item 8: collectives of two communicators on one device run in the order the host
// issued them (nccl_group.cpp, DeviceLaunchOrder), as an FSDP group's prefetched all-gather and
// a tensor-parallel all-reduce must, or they can deadlock across ranks. Group a's gather is held
// back 50 ms on its stream; group b's gather reads what a's wrote. Without the order, b's stream
// waits only for the caller's stream and reads the zeros there before a's gather lands.
TEST(NcclGroup, TwoCommunicatorsOfOneDeviceRunInIssueOrder) {
  SKIP_WITHOUT_GPU();
  setenv("FSDP_DEBUG_COMM_DELAY_MS", "50", 1);
  auto a = engine_group();
  unsetenv("FSDP_DEBUG_COMM_DELAY_MS");
  auto b = engine_group();
  const int64_t n = 1 << 20;
  auto ones = at::ones({n}, cuda());
  auto middle = at::zeros({n}, cuda());
  auto last = at::zeros({n}, cuda());
  auto wa = a->all_gather(middle, ones);
  auto wb = b->all_gather(last, middle);
  wb->wait();
  wa->wait();
  EXPECT_TRUE(at::equal(last.cpu(), ones.cpu())) << "b's gather ran before a's";
}

// Issue 39, item 8: a quantized gather completed from another thread (whose current stream is
// held busy) dequantizes on the stream current at issue, which the issuer reads on at once.
TEST(NcclGroup, QuantizedGatherDequantizesOnTheIssuingStream) {
  SKIP_WITHOUT_GPU();
  auto pg = engine_group();
  auto gather = quantized_all_gather({/*block_size=*/32});
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
  at::Tensor input, output;
  WorkPtr work;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    input = at::linspace(-1, 1, 4096, cuda());
    output = at::full({4096}, std::nan(""), cuda());
    work = gather(output, input, *pg, {0});
  }
  std::thread([&] {
    // This thread's current stream (the default one) is busy for about half a second.
    at::cuda::sleep(int64_t{1} << 30);
    while (!work->is_completed()) std::this_thread::yield();
  }).join();
  at::Tensor got;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    got = output.cpu();  // ordered on `side` only
  }
  // int8 with one scale per 32 elements: within half a step of each block's largest / 127.
  const double err = (got - input.cpu()).abs().max().item<double>();
  EXPECT_LE(err, 0.5 / 127 + 1e-6) << "read before the dequantization (NaN: it ran elsewhere)";
  c10::cuda::device_synchronize();
}

}  // namespace
}  // namespace fsdp
