// What a run will write, checked before it starts: a run that can write nothing at its end (a
// read-only mount, a file where a directory should be, a path that would overwrite a user's
// file) fails at parse time with exit 2, not after hours of training.
#pragma once

#include <string>

#include "train_options.h"

namespace trainer {

// The launched rank of this process, before the flags are checked (trainer_main sets it). The
// files rank 0 alone writes (--export, --export-hf, --export-adapter, --metrics-out) are
// checked there alone: another host's ranks may not see its paths, and a refusal only they
// reached would end the job without a word (rank 0 prints the verdict). --save-dir, which
// every rank writes, is checked on every rank.
void set_output_rank(int rank);

// A file the run creates (--export): a new path, in a directory that exists or can be made, and
// written. The error ("FLAG PATH: ...") or "".
std::string check_new_file(const char* flag, const std::string& path);

// A file the run writes, replacing or extending it (--metrics-out): not a directory, and
// writable itself when it exists (/dev/stdout, a pipe), else its directory (made if missing).
std::string check_writable_file(const char* flag, const std::string& path);

// A directory the run creates (--export-hf, --export-adapter; whether it may exist already is
// the caller's rule): its parent can be made and written.
std::string check_new_directory(const char* flag, const std::string& path);

// --save-dir: a directory (existing or to be made) that can be written. A run that saves
// without --resume into one that holds checkpoints already is refused: its checkpoints would
// mix with the other run's (and a later --resume could pick the other run's newest). A newest
// checkpoint without its manifest (damaged) is refused too.
std::string check_save_dir(const TrainOptions& o);

}  // namespace trainer
