#include "fsdp/runtime/lifecycle.h"

namespace fsdp {

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle:
      return "idle";
    case TrainingState::kForward:
      return "forward";
    case TrainingState::kPreBackward:
      return "pre-backward";
    case TrainingState::kPostBackward:
      return "post-backward";
  }
  return "unknown";
}

const char* to_string(ShardedState state) {
  switch (state) {
    case ShardedState::kSharded:
      return "sharded";
    case ShardedState::kShardedPostForward:
      return "sharded-post-forward";
    case ShardedState::kUnsharded:
      return "unsharded";
  }
  return "unknown";
}

}  // namespace fsdp
