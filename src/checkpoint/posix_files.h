// Internal: the few directory operations checkpoints need, on POSIX calls. Not
// std::filesystem: libtorch 2.11's libtorch.so exports its own copies of std::filesystem's
// functions (remove_all, rename, create_directories, status, ... 64 symbols), which the
// dynamic linker binds ahead of libstdc++'s, and its remove_all crashes (a jump to address 0;
// see docs/libtorch.md).
#pragma once

#include <string>
#include <vector>

namespace fsdp::detail {

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// mkdir -p; CheckpointError naming the path when it cannot.
void make_directories(const std::string& path);
// rm -rf; CheckpointError naming the first entry that cannot be removed.
void remove_tree(const std::string& path);
// The names in a directory (no "." or ".."); empty when it does not exist.
std::vector<std::string> list_directory(const std::string& path);
// strerror(errno): the reason of the last failed POSIX call, for messages.
std::string os_error();
// rename(2): atomic within one file system. CheckpointError when it fails.
void rename_path(const std::string& from, const std::string& to);

}  // namespace fsdp::detail
