// MiniLLM described to the planner: train_minillm --plan (deprecated) and fsdp_plan minillm.
#include <fmt/format.h>

#include "fsdp/errors.h"
#include "fsdp/models/minillm_plan.h"
#include "minillm_options.h"

namespace minillm {

trainer::PlanModel plan_model(const Options& o) {
  namespace mm = fsdp::models::minillm;
  trainer::PlanModel m;
  m.describe = fmt::format("MiniLLM vocab {} dim {} layers {} heads {}", o.model.vocab, o.model.dim,
                           o.model.layers, o.model.heads);
  m.units = [&o](int64_t sequences, int compute_bytes, bool checkpointed, int tp) {
    if (tp > 1) throw fsdp::InvalidArgument("MiniLLM has no tensor parallelism");
    mm::PlanShape shape;
    shape.model = o.model;
    shape.seq = o.train.seq;
    shape.batch_per_rank = sequences;
    shape.compute_bytes = compute_bytes;
    shape.activation_checkpointing = checkpointed;
    return mm::plan_units(shape);
  };
  m.transient_bytes = [&o](int64_t tokens, int) {
    return mm::loss_transient_bytes(o.model, tokens);
  };
  return m;
}

}  // namespace minillm
