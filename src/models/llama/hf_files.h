// Internal: the file operations a Hugging Face directory needs, on POSIX calls (not
// std::filesystem: libtorch 2.11 exports broken copies of it, see src/checkpoint/posix_files.h).
// Errors are CheckpointError naming the path and the system's reason.
#pragma once

#include <string>

namespace fsdp::models::llama::detail {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// The whole file as text.
std::string read_text_file(const std::string& path);
// Creates (or truncates) `path` with `text`, flushed to disk (fsync).
void write_text_file(const std::string& path, const std::string& text);
// Copies a regular file, flushed to disk.
void copy_file(const std::string& from, const std::string& to);
// fsync of a file or a directory (a directory's entries: after a rename or a create).
void fsync_path(const std::string& path);
// "a/b/c" -> "a/b"; "c" -> "."; trailing slashes ignored.
std::string parent_directory(const std::string& path);
// "a/b/c/" -> "a/b/c".
std::string without_trailing_slash(const std::string& path);

}  // namespace fsdp::models::llama::detail
