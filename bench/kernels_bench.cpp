// kernels_bench: the fused ops (fsdp/ops/fused.h, float8.h) against the ATen formulas they
// replace, forward and backward, at Llama-3.2-1B's shapes by default (8,192 tokens of hidden
// 2048, 32 heads of 64, intermediate 8192; bf16); and float8_linear against the bf16 linear at
// the layer's Linear shapes (q/o 2048 -> 2048, gate/up 2048 -> 8192, down 8192 -> 2048; the
// rowwise recipe at gate/up's too); and the fused linear cross-entropy (linear_cross_entropy.h:
// its chunks' cross-entropy kernel and float32 weight-gradient accumulation on a GPU) against
// the unfused head and loss as transformers computes them (bf16 logits, then cross_entropy on
// their float32 copy), at Llama 3's vocabulary of 128,256 by default.
//
// Each row times forward + backward of one op, the median of --repeats runs of --iters calls
// between two device synchronisations, in milliseconds per call, and the ratio ATen / fused
// (above 1: the fused op is faster). On a GPU with this build's CUDA kernels the fused column
// runs them; elsewhere both columns run ATen (a check of the program, not a measurement).
//
//   kernels_bench [--device cuda] [--tokens 8192 --hidden 2048 --heads 32 --intermediate 8192]
//                 [--vocab 128256] [--iters 20 --repeats 5] [--json FILE]
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "fsdp/ops/float8.h"
#include "fsdp/ops/fused.h"
#include "fsdp/ops/linear_cross_entropy.h"

namespace {

struct Sizes {
  int64_t tokens = 8192, hidden = 2048, heads = 32, intermediate = 8192, vocab = 128256;
  int iters = 20, repeats = 5;
  std::string device = "cpu";
};

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index() < 0 ? 0 : d.index());
}

// Milliseconds per call of `step`, the median over repeats.
double time_ms(const std::function<void()>& step, const Sizes& s, const torch::Device& d) {
  for (int i = 0; i < 3; ++i) step();  // warm-up: allocator, kernels' first launch
  std::vector<double> runs;
  for (int r = 0; r < s.repeats; ++r) {
    sync(d);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < s.iters; ++i) step();
    sync(d);
    const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
    runs.push_back(dt.count() / s.iters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// Forward and backward of `f` on leaves made from `inputs` (each requiring a gradient).
std::function<void()> fwd_bwd(std::vector<at::Tensor> inputs,
                              std::function<at::Tensor(const std::vector<at::Tensor>&)> f,
                              const at::Tensor& grad) {
  for (auto& t : inputs) t = t.detach().requires_grad_();
  return [inputs, f, grad] {
    for (const auto& t : inputs) t.mutable_grad() = at::Tensor();
    f(inputs).backward(grad);
  };
}

at::Tensor rms_formula(const at::Tensor& x, const at::Tensor& w) {
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-5);
  return w * h.to(x.scalar_type());
}

at::Tensor rope_formula(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

struct Row {
  std::string op;
  double fused_ms, aten_ms;
};

}  // namespace

int main(int argc, char** argv) {
  Sizes s;
  std::string json;
  CLI::App app{"The fused ops and float8_linear against ATen, forward + backward"};
  app.add_option("--device", s.device, "cpu or cuda")->capture_default_str();
  app.add_option("--tokens", s.tokens, "Tokens (batch x sequence)")->capture_default_str();
  app.add_option("--hidden", s.hidden, "Hidden size")->capture_default_str();
  app.add_option("--heads", s.heads, "Attention heads (head size hidden / heads)")
      ->capture_default_str();
  app.add_option("--intermediate", s.intermediate, "MLP size")->capture_default_str();
  app.add_option("--vocab", s.vocab, "Vocabulary of the loss's row")->capture_default_str();
  app.add_option("--iters", s.iters, "Calls per timed run")->capture_default_str();
  app.add_option("--repeats", s.repeats, "Timed runs (the median is reported)")
      ->capture_default_str();
  app.add_option("--json", json, "Also write the rows as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (s.tokens < 1 || s.hidden < 16 || s.heads < 1 || s.hidden % s.heads != 0 ||
      (s.hidden / s.heads) % 2 != 0 || s.intermediate < 16 || s.vocab < 2 || s.iters < 1 ||
      s.repeats < 1) {
    fmt::print(stderr,
               "error: expected positive sizes, --hidden a multiple of --heads with an even head "
               "size, got tokens {} hidden {} heads {} intermediate {} vocab {}\n",
               s.tokens, s.hidden, s.heads, s.intermediate, s.vocab);
    return 2;
  }
  const torch::Device device(s.device);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    fmt::print(stderr, "error: --device cuda but no CUDA device is available\n");
    return 2;
  }
  torch::manual_seed(0);
  const auto opts = at::TensorOptions().device(device).dtype(at::kBFloat16);
  const int64_t t = s.tokens, d = s.hidden, i = s.intermediate, hd = d / s.heads;
  std::vector<Row> rows;
  auto row = [&](const std::string& op, const std::function<void()>& fused,
                 const std::function<void()>& aten) {
    rows.push_back({op, time_ms(fused, s, device), time_ms(aten, s, device)});
  };

  const auto x = torch::randn({t, d}, opts), y = torch::randn({t, d}, opts);
  const auto w = torch::rand({d}, opts) + 0.5;
  row("rms_norm",
      fwd_bwd(
          {x, w}, [](auto& v) { return fsdp::ops::rms_norm(v[0], v[1], 1e-5); }, x),
      fwd_bwd(
          {x, w}, [](auto& v) { return rms_formula(v[0], v[1]); }, x));
  row("add_rms_norm",
      fwd_bwd(
          {x, y, w},
          [](auto& v) {
            auto [h, n] = fsdp::ops::add_rms_norm(v[0], v[1], v[2], 1e-5);
            return h + n;
          },
          x),
      fwd_bwd(
          {x, y, w},
          [](auto& v) {
            auto h = v[0] + v[1];
            return h + rms_formula(h, v[2]);
          },
          x));
  const auto gate = torch::randn({t, i}, opts), up = torch::randn({t, i}, opts);
  row("swiglu",
      fwd_bwd(
          {gate, up}, [](auto& v) { return fsdp::ops::swiglu(v[0], v[1]); }, gate),
      fwd_bwd(
          {gate, up}, [](auto& v) { return at::silu(v[0]) * v[1]; }, gate));
  // q as the model has it: a heads-first view of a [batch, seq, heads, head size] projection;
  // batch 4 and the rest as sequence, like the GPU check's Llama-3.2-1B step.
  const int64_t batch = t % 4 == 0 ? 4 : 1, seq = t / batch;
  const auto q = torch::randn({batch, seq, s.heads, hd}, opts).transpose(1, 2);
  const auto cos = torch::randn({1, seq, hd}, opts), sin = torch::randn({1, seq, hd}, opts);
  const auto dq = torch::randn({batch, s.heads, seq, hd}, opts);
  row("rope",
      fwd_bwd(
          {q}, [&](auto& v) { return fsdp::ops::rope(v[0], cos, sin); }, dq),
      fwd_bwd(
          {q}, [&](auto& v) { return rope_formula(v[0], cos, sin); }, dq));
  // The float8 cast alone (no gradient): the kernels against torchao's ATen ops.
  auto aten_cast = [](const at::Tensor& v) {
    const auto scale = fsdp::ops::float8_scale(v.abs().max(), at::kFloat8_e4m3fn);
    return (v.to(at::kFloat) * scale).clamp(-448, 448).to(at::kFloat8_e4m3fn);
  };
  row(
      "to_float8", [&] { fsdp::ops::to_float8(x, at::kFloat8_e4m3fn); }, [&] { aten_cast(x); });
  // float8_linear against the bf16 linear, at the layer's three Linear shapes (where the device
  // has float8 GEMMs: compute capability 8.9 and newer, or the CPU).
  bool float8_gemm = true;
  try {
    fsdp::ops::float8_linear(torch::randn({16, 16}, opts), torch::randn({16, 16}, opts), {});
  } catch (const std::exception& e) {
    float8_gemm = false;
    fmt::print("float8 rows left out: {}\n", std::string(e.what()).substr(0, 200));
  }
  for (auto [in, out, name] : std::vector<std::tuple<int64_t, int64_t, std::string>>{
           {d, d, "q/o_proj"}, {d, i, "gate/up_proj"}, {i, d, "down_proj"}}) {
    if (!float8_gemm) break;
    const auto xin = torch::randn({t, in}, opts), wl = torch::randn({out, in}, opts) * 0.02;
    const auto g = torch::randn({t, out}, opts);
    row(fmt::format("float8 {} {}x{}", name, in, out),
        fwd_bwd(
            {xin, wl}, [](auto& v) { return fsdp::ops::float8_linear(v[0], v[1], {}); }, g),
        fwd_bwd(
            {xin, wl}, [](auto& v) { return at::linear(v[0], v[1]); }, g));
    if (in == d && out == i) {  // the rowwise recipe at one shape: its GEMMs and ATen casts
      row(fmt::format("float8 rowwise {} {}x{}", name, in, out),
          fwd_bwd(
              {xin, wl},
              [](auto& v) {
                return fsdp::ops::float8_linear(v[0], v[1], {}, {},
                                                fsdp::ops::Float8Scaling::rowwise);
              },
              g),
          fwd_bwd(
              {xin, wl}, [](auto& v) { return at::linear(v[0], v[1]); }, g));
    }
  }

  // The head and the loss: a call is tens of milliseconds at 8,192 tokens of 128,256, so fewer
  // calls per timed run (the stage's time cap holds).
  {
    Sizes few = s;
    few.iters = std::min(s.iters, 3);
    few.repeats = std::min(s.repeats, 3);
    const auto hidden = torch::randn({t, d}, opts);
    const auto head = torch::randn({s.vocab, d}, opts) * 0.02;
    const auto targets =
        torch::randint(0, s.vocab, {t}, at::TensorOptions().device(device).dtype(at::kLong));
    const auto one = torch::ones({}, opts.dtype(at::kFloat));
    rows.push_back(
        {fmt::format("linear_cross_entropy vocab {}", s.vocab),
         time_ms(fwd_bwd(
                     {hidden, head},
                     [&](auto& v) { return fsdp::ops::linear_cross_entropy(v[0], v[1], targets); },
                     one),
                 few, device),
         time_ms(fwd_bwd(
                     {hidden, head},
                     [&](auto& v) {
                       return at::cross_entropy_loss(at::linear(v[0], v[1]).to(at::kFloat),
                                                     targets);
                     },
                     one),
                 few, device)});
  }

  const char* switch_ = std::getenv("FSDP_CUDA_KERNELS");
  const bool kernels = device.is_cuda() && fsdp::ops::cuda_kernels_built() &&
                       (switch_ == nullptr || std::string(switch_) != "0");
  fmt::print("kernels_bench: {} tokens, hidden {}, {} heads of {}, intermediate {}, bf16, {}{}\n",
             t, d, s.heads, hd, i, s.device,
             kernels ? ", CUDA kernels" : " (no CUDA kernels: both columns run ATen)");
  fmt::print("{:<36} {:>10} {:>10} {:>8}\n", "op (fwd+bwd)", "fused ms", "aten ms", "ratio");
  for (const auto& r : rows) {
    fmt::print("{:<36} {:>10.3f} {:>10.3f} {:>7.2f}x\n", r.op, r.fused_ms, r.aten_ms,
               r.aten_ms / r.fused_ms);
  }
  fmt::print(
      "(float8 rows: float8_linear against the bf16 linear; to_float8: the cast alone; "
      "linear_cross_entropy: against linear, then cross_entropy on float32 logits)\n");
  if (!json.empty()) {
    std::ofstream f(json);
    f << "[";
    for (size_t k = 0; k < rows.size(); ++k) {
      f << (k ? "," : "")
        << fmt::format("{{\"op\":\"{}\",\"fused_ms\":{},\"aten_ms\":{},\"cuda_kernels\":{}}}",
                       rows[k].op, rows[k].fused_ms, rows[k].aten_ms, kernels);
    }
    f << "]\n";
    if (!f) {
      fmt::print(stderr, "error: could not write {}\n", json);
      return 1;
    }
  }
  return 0;
}
