#include "runtime/reduce.h"

#include "util/check.h"

namespace fsdp::detail {
namespace {

// One parameter's gradient rows into a [world, padded] view, each rank's rows at its place and
// zeros for padding, casting to the view's dtype.
void copy_grad_rows(const FsdpParam& p, const at::Tensor& grad, const at::Tensor& dst) {
  const int64_t row_numel = p.shape().row_numel, padded = p.padded_numel();
  auto rows = grad.reshape({p.shape().dim0, row_numel});
  for (int r = 0; r < p.world(); ++r) {
    const ShardRange& range = p.range(r);
    const int64_t n = range.rows() * row_numel;
    if (n > 0) {
      dst[r]
          .narrow(0, 0, n)
          .view({range.rows(), row_numel})
          .copy_(rows.narrow(0, range.begin, range.rows()));
    }
    if (n < padded) dst[r].narrow(0, n, padded - n).zero_();
  }
}

// Moves every full gradient into `send` (world * layout.total elements, the reduce dtype), each
// rank's rows at its place, zeros for padding and missing gradients. Returns, per parameter,
// whether it had a gradient.
std::vector<bool> reduce_scatter_copy_in(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                         const at::Tensor& send, int world) {
  std::vector<bool> had_grad(params.size(), false);
  std::vector<at::Tensor> grads;
  std::vector<size_t> index;
  bool same_dtype = true;
  for (size_t i = 0; i < params.size(); ++i) {
    if (layout.offset[i] < 0) {
      params[i].drop_full_grad();  // frozen since: its gradient is not reduced
      continue;
    }
    at::Tensor g = params[i].take_full_grad();
    had_grad[i] = g.defined();
    // No gradient contributes zeros (rare: a parameter unused in this backward).
    if (!g.defined()) g = at::zeros(params[i].full_shape(), send.options());
    // Shard(d > 0) (even): its chunks of dim d stacked on dim 0 (FSDP2's torch.cat of
    // torch.chunk), so that dealing rows to ranks deals each rank its chunk.
    if (const int d = params[i].shard_dim(); d != 0 && world > 1) {
      g = at::cat(at::chunk(g, world, d), 0);
    }
    same_dtype = same_dtype && g.scalar_type() == send.scalar_type();
    grads.push_back(std::move(g));
    index.push_back(i);
  }
  if (grads.empty()) return had_grad;
  at::Tensor per_rank = send.view({world, layout.total});
  at::NoGradGuard no_grad;
  if (same_dtype || !send.is_cpu()) {
    // FSDP2's foreach_reduce_scatter_copy_in: chunk every gradient into `world` blocks of
    // ceil(dim0 / world) rows (torch.chunk, padded with zeros) and lay rank r's blocks side by
    // side in row r, casting to the reduce dtype: exactly the flat layout. One kernel on CUDA;
    // _chunk_cat takes one input dtype, so mixed ones (kept gradients in the reduce dtype beside
    // this backward's) are cast first.
    bool one_dtype = true;
    for (const auto& g : grads) one_dtype = one_dtype && g.scalar_type() == grads[0].scalar_type();
    if (!one_dtype) {
      for (auto& g : grads) g = g.to(send.scalar_type());
    }
    at::_chunk_cat_out(per_rank, grads, /*dim=*/0, /*num_chunks=*/world);
  } else {
    // On the CPU, _chunk_cat's casting path is slower than copying rows (bf16 gradients of the
    // 32000 x 256 embedding and head into fp32: 23 against 14 to 18 ms, one thread).
    for (size_t k = 0; k < grads.size(); ++k) {
      const size_t i = index[k];
      copy_grad_rows(params[i], grads[k],
                     per_rank.narrow(1, layout.offset[i], params[i].padded_numel()));
    }
  }
  return had_grad;
}

// Adds this rank's reduced rows (`reduced`, layout.total elements) into the sharded gradients
// of the parameters that had one.
void reduce_scatter_copy_out(const std::vector<FsdpParam*>& params, const FlatLayout& layout,
                             const at::Tensor& reduced, const std::vector<bool>& had_grad) {
  // Gradients that exist (accumulation) take one foreach add; new ones are allocated and
  // filled by one foreach copy (a fresh tensor each: `reduced` is a buffer about to be freed,
  // and optimizers detach_() grads, which views do not allow).
  std::vector<at::Tensor> sums, addends, fresh, sources;
  std::vector<size_t> fresh_index;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!had_grad[i]) continue;
    const at::Tensor& shard = params[i]->shard();
    auto rows = reduced.narrow(0, layout.offset[i], params[i]->padded_numel())
                    .narrow(0, 0, shard.numel())
                    .view(shard.sizes());
    const at::Tensor& grad = params[i]->param().grad();
    if (grad.defined()) {
      sums.push_back(grad);
      addends.push_back(rows);
    } else {
      fresh.push_back(at::empty(shard.sizes(), shard.options()));
      sources.push_back(rows);
      fresh_index.push_back(i);
    }
  }
  at::NoGradGuard no_grad;
  if (!sums.empty()) at::_foreach_add_(sums, addends);
  if (!fresh.empty()) at::_foreach_copy_(fresh, sources);
  for (size_t k = 0; k < fresh.size(); ++k) {
    params[fresh_index[k]]->param().mutable_grad() = std::move(fresh[k]);
  }
}

// A custom factor divides the sum once at the end; the default averages at each level (the
// engines' own average, as FSDP2 does), except over one rank, where the sum is the average and
// FSDP2 sums too (NCCL's average over one rank was wrong: NVIDIA/nccl issue 1950).
ReduceOp op_over(const ReduceSpec& spec, const ProcessGroup& group) {
  return spec.divide_factor > 0 || group.size() == 1 ? ReduceOp::kSum : ReduceOp::kAvg;
}

}  // namespace

Reduction::Reduction(std::vector<FsdpParam*> params, const FlatLayout& layout,
                     const ReduceSpec& spec, std::vector<bool> had_grad, at::Tensor input,
                     at::Tensor output, WorkPtr work, std::shared_ptr<DeferredReduce> deferred,
                     std::shared_ptr<CommContext> comm, std::shared_ptr<const UnitRangeNames> names)
    : params_(std::move(params)),
      layout_(layout),
      spec_(spec),
      had_grad_(std::move(had_grad)),
      input_(std::move(input)),
      output_(std::move(output)),
      work_(std::move(work)),
      deferred_(std::move(deferred)),
      comm_(std::move(comm)),
      names_(std::move(names)) {}

void Reduction::wait_work() {
  if (auto comm = comm_.lock()) {
    work_->wait_timed(comm->exposed());
  } else {
    work_->wait();
  }
}

void Reduction::release(at::Tensor& buffer) {
  if (!buffer.defined()) return;
  if (auto comm = comm_.lock()) comm->give_buffer(std::move(buffer));
  buffer = at::Tensor();
}

void Reduction::start_all_reduce() {
  if (stage_ != Stage::kReduceScatter || !hybrid()) return;
  {
    FSDP_RANGE(names_->reduce_scatter_wait);
    wait_work();
  }
  // The reduce-scatter's input (world-sized) is spent: back to the pool now, so that the next
  // unit's reduce-scatter reuses it while this all-reduce runs. Resetting the work drops the
  // backend's last reference to it.
  work_.reset();
  release(input_);
  stage_ = Stage::kAllReduce;
  if (deferred_ && deferred_->reduced.defined()) {
    // Shards kept by backwards without the all-reduce join this one.
    FSDP_CHECK_ARG(deferred_->reduced.numel() == output_.numel(),
                   "fsdp: the trainable parameters of a unit changed while reduced gradients "
                   "waited for their all-reduce (set_requires_all_reduce(false)); change "
                   "requires_grad only after a backward with the all-reduce on");
    output_.add_(deferred_->reduced);
    deferred_->reduced = at::Tensor();
    for (size_t i = 0; i < had_grad_.size() && i < deferred_->had_grad.size(); ++i) {
      had_grad_[i] = had_grad_[i] || deferred_->had_grad[i];
    }
    deferred_->had_grad.clear();
  }
  if (!spec_.all_reduce) return;
  FSDP_RANGE(names_->all_reduce);
  // The shard group averaged over its ranks; averaging over the replicas makes it the average
  // over the world. In place on the reduced shard: no further buffer.
  work_ = spec_.replicate->all_reduce(output_, op_over(spec_, *spec_.replicate));
}

void Reduction::finish() {
  if (stage_ == Stage::kFinished) return;
  start_all_reduce();
  if (work_) {  // the all-reduce (hybrid) or the reduce-scatter
    FSDP_RANGE(stage_ == Stage::kAllReduce ? names_->all_reduce_wait : names_->reduce_scatter_wait);
    wait_work();
  }
  work_.reset();  // the backend's last reference to the buffers
  if (hybrid() && !spec_.all_reduce) {
    // Hybrid accumulation without the all-reduce: the reduced shard waits for the next one.
    if (deferred_->reduced.defined()) {
      deferred_->reduced.add_(output_);
    } else {
      deferred_->reduced = output_.clone();
    }
    deferred_->had_grad.resize(had_grad_.size(), false);
    for (size_t i = 0; i < had_grad_.size(); ++i) {
      deferred_->had_grad[i] = deferred_->had_grad[i] || had_grad_[i];
    }
  } else {
    // FSDP2's order: the hook sees the reduced (and, hybrid, all-reduced) shard before a custom
    // factor divides it.
    if (spec_.hooks.all_reduce) {
      FSDP_RANGE("fsdp::all_reduce_hook");
      spec_.hooks.all_reduce(output_);
    }
    if (spec_.divide_factor > 0) output_.div_(spec_.divide_factor);
    FSDP_RANGE("fsdp::reduce_scatter_copy_out");
    if (spec_.to_host) {
      // Offload: to the host first, into pinned memory from a GPU (a blocking copy: the copy-out
      // adds on the host right after, and the optimizer steps there once the backward returns;
      // FSDP2 overlaps this copy with an event when it need not accumulate, not done here). A
      // copy even when the host is the device, so the path is the same without a GPU.
      at::Tensor host = at::empty(output_.sizes(), output_.options().device(at::kCPU).pinned_memory(
                                                       spec_.pin_host && output_.is_cuda()));
      host.copy_(output_);
      reduce_scatter_copy_out(params_, layout_, host, had_grad_);
    } else {
      reduce_scatter_copy_out(params_, layout_, output_, had_grad_);
    }
  }
  release(input_);
  release(output_);
  stage_ = Stage::kFinished;
}

std::shared_ptr<Reduction> foreach_reduce(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                          const ReduceSpec& spec,
                                          std::shared_ptr<DeferredReduce> deferred,
                                          std::shared_ptr<CommContext> comm,
                                          std::shared_ptr<const UnitRangeNames> names) {
  FSDP_RANGE(names->reduce_scatter);
  const int world = spec.shard->size();
  const auto options = at::TensorOptions().dtype(spec.dtype).device(spec.shard->device());
  // Copy-in writes every element: gradient rows, or zeros for padding and missing gradients.
  at::Tensor input = comm->take_buffer(world * layout.total, options);
  at::Tensor output;
  std::vector<bool> had_grad;
  WorkPtr work;
  try {
    {
      FSDP_RANGE("fsdp::reduce_scatter_copy_in");
      had_grad = reduce_scatter_copy_in(params, layout, input, world);
    }
    if (spec.zeros_if_unused) {
      // Ranks may differ in which parameters got a gradient: the reduced rows land in every
      // parameter of the layout, as FSDP2 gives the unused ones zero gradients before reducing.
      for (size_t i = 0; i < params.size(); ++i) {
        if (layout.offset[i] >= 0) had_grad[i] = true;
      }
    }
    output = comm->take_buffer(layout.total, options);
    // A custom factor divides the sum once at the end; the default averages at each level (the
    // engines' own average, as FSDP2 does).
    work = issue_reduce_scatter(spec.hooks, *spec.shard, output, input, op_over(spec, *spec.shard));
  } catch (...) {
    // Nothing was issued: the buffers go back, so the counters stay true (an out-of-memory a
    // caller catches must not leave them inflated).
    comm->give_buffer(std::move(input));
    comm->give_buffer(std::move(output));
    throw;
  }
  std::vector<FsdpParam*> targets;
  targets.reserve(params.size());
  for (auto& p : params) targets.push_back(&p);
  return std::make_shared<Reduction>(std::move(targets), layout, spec, std::move(had_grad),
                                     std::move(input), std::move(output), std::move(work),
                                     std::move(deferred), std::move(comm), std::move(names));
}

void track_reduction(CommContext& comm, std::shared_ptr<Reduction> reduction) {
  // One reduce-scatter may run while the next unit's backward computes; older ones are waited
  // for. With hybrid sharding the previous unit's all-reduce across replicas may run as well
  // (on the replicate group, beside this reduce-scatter on the shard group): the unit before
  // the newest moves on to its all-reduce instead of finishing (returning its reduce-scatter's
  // input to the pool), and older ones finish. So the gradient buffers of at most
  // kReductionsInFlight units are alive at once, and with hybrid sharding a third unit's
  // reduced shard.
  auto& in_flight = comm.reductions_in_flight();
  in_flight.push_back(std::move(reduction));
  while (in_flight.size() > kReductionsInFlight - 1) {
    Reduction& oldest = *in_flight.front();
    if (in_flight.size() == kReductionsInFlight && oldest.reduce_scatter_pending() &&
        oldest.hybrid()) {
      oldest.start_all_reduce();
      break;
    }
    oldest.finish();
    in_flight.pop_front();
  }
}

void finish_reductions(CommContext& comm) {
  // Oldest first: the order every rank issued them in.
  auto& in_flight = comm.reductions_in_flight();
  for (auto& r : in_flight) r->finish();
  in_flight.clear();
}

}  // namespace fsdp::detail
