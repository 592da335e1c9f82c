// Where a unit is in a training step (FSDP2's TrainingState and ShardedState), as
// FSDPModule::training_state() and sharded_state() report them.
//
//            pre_forward                post_forward
//   kIdle ---------------> kForward ----------------> kIdle
//     |                                                  | the gradient reaches the outputs
//     |                                                  v
//     |   end of backward                          kPreBackward
//     +<---------------------- kPostBackward <-----------+
//                                  (gradients reduced)
//
//   kSharded --gather--> kUnsharded --reshard--> kSharded
//                            | reshard after forward with reshard_after_forward_ranks
//                            v
//                   kShardedPostForward --gather within the smaller group--> kUnsharded
#pragma once

namespace fsdp {

enum class TrainingState {
  kIdle,          // between steps, or between a forward and its backward
  kForward,       // its forward runs (pre-forward done, post-forward not yet)
  kPreBackward,   // its backward has begun: parameters gathered again
  kPostBackward,  // its backward is over: gradients reduced (or kept), until the end of backward
};

enum class ShardedState {
  kSharded,             // the parameters hold this rank's shards
  kShardedPostForward,  // freed after forward, this rank's rows of a smaller group kept
  kUnsharded,           // the parameters hold the full tensors
};

const char* to_string(TrainingState state);
const char* to_string(ShardedState state);

}  // namespace fsdp
