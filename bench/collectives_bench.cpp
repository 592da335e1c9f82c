// All-gather, reduce-scatter and all-reduce bandwidth against message size, as nccl-tests
// reports it: busbw = bytes x (n - 1) / n / time (all-reduce: 2 (n - 1) / n), where bytes is
// the full (gathered / unreduced / reduced) buffer. Compare with the machine's memory copy
// bandwidth, printed first. --table FILE appends op,ranks,bytes,seconds rows: the measured
// times the planner interpolates (fsdp_plan minillm --plan-collectives FILE).
//   mpirun -np N build/bin/collectives_bench [--backend mpi]     (processes)
//   build/bin/collectives_bench --backend local --world N         (thread ranks)
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/fsdp.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Single-thread memcpy bandwidth (read + write counted once, like busbw's bytes moved).
double memcpy_gbps(int64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes);
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    double t0 = now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(now() - t0);
  }
  return bytes / median(t) / 1e9;
}

// Threads that multiply matrices until destroyed: the compute a training rank runs beside its
// collectives. On a machine with fewer cores than ranks x 2 the collectives then get the share
// of the CPU they get in training (--busy).
class BusyThreads {
 public:
  explicit BusyThreads(int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        auto a = at::randn({256, 256});
        auto out = at::empty({256, 256});
        while (!stop_.load(std::memory_order_relaxed)) at::mm_out(out, a, a);
      });
    }
  }
  ~BusyThreads() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

struct Row {
  int64_t bytes;
  double ag_us, ag_busbw, rs_us, rs_busbw, ar_us, ar_busbw;
};

std::vector<Row> run(fsdp::ProcessGroup& pg, int64_t max_bytes, int iters, bool cold) {
  std::vector<Row> rows;
  const int n = pg.size();
  // --cold: written before each timed collective, larger than the last-level cache, so the
  // collective finds its buffers in memory, as a training step does (it last touched them a
  // unit earlier); hot buffers flatter the sizes that fit in the cache.
  auto scratch = cold ? at::empty({64 << 20 >> 2}) : at::Tensor();
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    int64_t full = std::max<int64_t>(n, bytes / 4 / n * n);  // floats, divisible by n
    auto big = at::ones({full});
    auto part = at::ones({full / n});
    auto time_op = [&](auto op) {
      op();  // warm-up
      std::vector<double> t;
      for (int i = 0; i < iters; ++i) {
        if (cold) {
          scratch.fill_(static_cast<float>(i));
          big.add_(0.0);  // each rank's own copy-in, as in training: its input written last
          part.add_(0.0);
        }
        pg.barrier()->wait();
        double t0 = now();
        op();
        t.push_back(now() - t0);
      }
      // The slowest rank defines a collective's time.
      auto x = at::full({1}, median(t), at::kDouble);
      auto all = at::empty({n}, at::kDouble);
      pg.all_gather(all, x)->wait();
      return all.max().item<double>();
    };
    double ag = time_op([&] { pg.all_gather(big, part)->wait(); });
    double rs = time_op([&] { pg.reduce_scatter(part, big, fsdp::ReduceOp::kAvg)->wait(); });
    double ar = time_op([&] { pg.all_reduce(big, fsdp::ReduceOp::kAvg)->wait(); });
    double moved = full * 4.0 * (n - 1) / n;
    rows.push_back({full * 4, ag * 1e6, moved / ag / 1e9, rs * 1e6, moved / rs / 1e9, ar * 1e6,
                    2 * moved / ar / 1e9});
  }
  return rows;
}

void print(const std::vector<Row>& rows, const std::string& backend, int world) {
  fmt::print("backend {} | world {} | float32 | busbw = bytes x (n-1)/n / time\n", backend, world);
  fmt::print("{:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "bytes", "ag us", "ag GB/s",
             "rs us", "rs GB/s", "ar us", "ar GB/s");
  for (const auto& r : rows) {
    fmt::print("{:>12} {:>12.1f} {:>12.2f} {:>12.1f} {:>12.2f} {:>12.1f} {:>12.2f}\n", r.bytes,
               r.ag_us, r.ag_busbw, r.rs_us, r.rs_busbw, r.ar_us, r.ar_busbw);
  }
}

// Appends the rows to `path` in the planner's format (fsdp/tools/planner.h, CommModel::measured).
bool append_table(const std::string& path, const std::vector<Row>& rows, int world) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return false;
  for (const auto& r : rows) {
    fmt::print(f, "all_gather,{},{},{:.9f}\n", world, r.bytes, r.ag_us * 1e-6);
    fmt::print(f, "reduce_scatter,{},{},{:.9f}\n", world, r.bytes, r.rs_us * 1e-6);
    fmt::print(f, "all_reduce,{},{},{:.9f}\n", world, r.bytes, r.ar_us * 1e-6);
  }
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Collective bandwidth of fsdp's CPU backends"};
  std::string backend = "auto";
  int world = 2, iters = 10;
  int64_t max_bytes = 64 << 20;
  app.add_option("--backend", backend, "auto (from the launcher), or local")
      ->check(CLI::IsMember({"auto", "local"}))
      ->capture_default_str();
  app.add_option("--world", world, "Thread ranks for --backend local")->capture_default_str();
  app.add_option("--iters", iters, "Timed iterations per size")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "Largest full buffer")->capture_default_str();
  std::string table;
  int busy = 0;
  bool cold = false;
  app.add_flag("--cold", cold,
               "Evict the caches before each timed collective (the planner's table: training "
               "finds its buffers in memory)");
  app.add_option("--busy", busy,
                 "Threads per rank multiplying matrices meanwhile (the training's compute)")
      ->capture_default_str();
  app.add_option("--table", table,
                 "Append op,ranks,bytes,seconds rows to this file (the planner's "
                 "--plan-collectives)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  try {
    if (backend == "local") {
      std::vector<std::vector<Row>> results(world);
      fsdp::run_local_ranks(world, [&](const fsdp::ProcessGroupPtr& pg) {
        results[pg->rank()] = run(*pg, max_bytes, iters, cold);
      });
      fmt::print("memcpy (1 thread): {:.2f} GB/s\n", memcpy_gbps(64 << 20));
      print(results[0], "local (threads)", world);
      if (!table.empty() && !append_table(table, results[0], world)) {
        fmt::print(stderr, "error: cannot append to --table {}\n", table);
        return 1;
      }
    } else {
      auto d = fsdp::init_from_env();
      std::vector<Row> rows;
      {
        BusyThreads load(busy);
        rows = run(*d.group, max_bytes, iters, cold);
      }
      if (d.group->rank() == 0) {
        fmt::print("memcpy (1 thread): {:.2f} GB/s\n", memcpy_gbps(64 << 20));
        print(rows, d.group->backend_name(), d.group->size());
        if (!table.empty() && !append_table(table, rows, d.group->size())) {
          fmt::print(stderr, "error: cannot append to --table {}\n", table);
          return 1;
        }
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
