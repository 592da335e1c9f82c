// Stress: thousands of collectives of random kinds, sizes (0 to 64 Ki elements, log-uniform),
// dtypes and reduce ops, up to four in flight at once, every result checked against values
// computed locally. Every rank draws the same sequence from the same seed.
//   stress_collectives [--ops N] [--seed S]              under mpirun or scripts/launch.sh
//   stress_collectives --local W [--ops N] [--seed S]    W thread ranks in this process
// Prints how many collectives ran and how many results were wrong; exits 1 on any.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <random>
#include <string>

#include "comm/dtype_tolerance.h"
#include "fsdp/fsdp.h"

namespace {

bool is_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// Element i of "source" k: small quarters for floats (sums over 4 ranks stay exact or within
// bfloat16's rounding), small integers otherwise (sums fit in uint8).
at::Tensor values(int64_t k, int64_t n, at::ScalarType dtype) {
  auto v = (k + 1) * 4.0 + at::remainder(at::arange(n, at::kDouble), 4);
  return is_floating(dtype) ? v * 0.25 : v;
}

bool close(const at::Tensor& got, const at::Tensor& want_double) {
  auto want = want_double.to(got.scalar_type()).to(at::kDouble).view(-1);
  auto g = got.to(at::kDouble).view(-1);
  if (g.numel() != want.numel()) return false;
  const double tol = fsdp::testing::collective_tolerance(got.scalar_type());
  return at::allclose(g, want, tol, tol);
}

struct Pending {
  fsdp::WorkPtr work;
  std::function<bool()> check;
  std::string what;
};

int64_t run(fsdp::ProcessGroup& pg, int ops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<at::ScalarType> dtypes{at::kFloat, at::kBFloat16, at::kHalf, at::kDouble,
                                           at::kInt,   at::kLong,     at::kByte};
  const int w = pg.size(), me = pg.rank();
  std::deque<Pending> in_flight;
  int64_t wrong = 0;
  auto finish = [&](Pending& p) {
    p.work->wait();
    if (!p.check()) {
      if (++wrong <= 5) std::fprintf(stderr, "rank %d: wrong result of %s\n", me, p.what.c_str());
    }
  };
  for (int i = 0; i < ops; ++i) {
    const auto dtype = dtypes[rng() % dtypes.size()];
    const int64_t n = rng() % 4 == 0 ? 0
                                     : static_cast<int64_t>(std::exp2(rng() % 17)) - 1 +
                                           static_cast<int64_t>(rng() % 3);
    const auto kind = rng() % 4;
    const auto op = is_floating(dtype) && rng() % 2 ? fsdp::ReduceOp::kAvg : fsdp::ReduceOp::kSum;
    const int root = static_cast<int>(rng() % w);
    const double div = op == fsdp::ReduceOp::kAvg ? w : 1;
    auto opts = at::TensorOptions().dtype(dtype);
    Pending p;
    p.what = fmt::format("#{} kind {} of {} {} elements", i, kind, n, c10::toString(dtype));
    if (kind == 0) {
      auto in = values(me, n, dtype).to(dtype);
      auto out = at::full({w * n}, -1, opts);
      p.work = pg.all_gather(out, in);
      p.check = [=] {
        std::vector<at::Tensor> parts;
        for (int r = 0; r < w; ++r) parts.push_back(values(r, n, dtype));
        return close(out, at::cat(parts));
      };
    } else if (kind == 1) {
      std::vector<at::Tensor> blocks;
      for (int b = 0; b < w; ++b) blocks.push_back(values(me + b, n, dtype));
      auto in = at::cat(blocks).to(dtype);
      auto out = at::full({n}, -1, opts);
      p.work = pg.reduce_scatter(out, in, op);
      p.check = [=] {
        auto want = at::zeros({n}, at::kDouble);
        for (int r = 0; r < w; ++r) want += values(r + me, n, dtype);
        return close(out, want / div);
      };
    } else if (kind == 2) {
      auto t = values(me, n, dtype).to(dtype);
      p.work = pg.all_reduce(t, op);
      p.check = [=] {
        auto want = at::zeros({n}, at::kDouble);
        for (int r = 0; r < w; ++r) want += values(r, n, dtype);
        return close(t, want / div);
      };
    } else {
      auto t = values(me, n, dtype).to(dtype);
      p.work = pg.broadcast(t, root);
      p.check = [=] { return close(t, values(root, n, dtype)); };
    }
    in_flight.push_back(std::move(p));
    if (in_flight.size() > 4) {
      finish(in_flight.front());
      in_flight.pop_front();
    }
  }
  for (auto& p : in_flight) finish(p);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 2000, local = 0;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ops")
      ops = std::atoi(argv[i + 1]);
    else if (flag == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--local")
      local = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: stress_collectives [--local W] [--ops N] [--seed S]\n");
      return 2;
    }
  }
  std::atomic<int64_t> wrong{0};
  std::string backend;
  int world = 0;
  auto body = [&](const fsdp::ProcessGroupPtr& pg) {
    const int64_t mine = run(*pg, ops, seed);
    auto total = at::full({1}, mine, at::kLong);
    pg->all_reduce(total, fsdp::ReduceOp::kSum)->wait();
    if (pg->rank() == 0) {
      wrong = total.item<int64_t>();
      backend = pg->backend_name();
      world = pg->size();
    }
  };
  if (local > 0) {
    fsdp::run_local_ranks(local, body);
  } else {
    auto d = fsdp::init_from_env();
    body(d.group);
    if (d.group->rank() != 0) return wrong.load() ? 1 : 0;
  }
  std::printf("stress: %d collectives on %s at world %d, up to 4 in flight: %lld wrong results\n",
              ops, backend.c_str(), world, static_cast<long long>(wrong.load()));
  return wrong.load() == 0 ? 0 : 1;
}
