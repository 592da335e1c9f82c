// Files and directories as checkpoints, Hugging Face directories and exports write them: every
// byte written (write(2) loops over EINTR and short writes), flushed to the disk (fsync of the
// file and, after entries change, of its directory), and published atomically (written under a
// staging name, then renamed into place), so that a crash at any moment leaves either the old
// state or the complete new one under the final name, never a truncated file there.
//
// Plain POSIX calls, not std::filesystem: libtorch 2.11's libtorch.so exports its own copies of
// std::filesystem's functions (remove_all, rename, create_directories, status, ...: 64
// symbols), which the dynamic linker binds ahead of libstdc++'s, and its remove_all crashes (a
// jump to address 0; docs/libtorch.md).
//
// Errors are IoError (fsdp/errors.h) naming the path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::io {

// --- paths ---------------------------------------------------------------------------------------

bool path_exists(const std::string& path);  // lstat: a dangling link exists
bool is_directory(const std::string& path);
// The names in a directory (no "." or ".."), unsorted; empty when it does not exist.
std::vector<std::string> list_directory(const std::string& path);
// mkdir -p, durably: each directory it makes is flushed into its parent (fsync), so that a save
// published inside survives a power cut with the directories above it.
void make_directories(const std::string& path);
// rm -rf; nothing when the path does not exist.
void remove_tree(const std::string& path);
// rename(2): atomic within one file system.
void rename_path(const std::string& from, const std::string& to);
// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/"; trailing slashes ignored.
std::string parent_directory(const std::string& path);
// "a/b/c/" -> "a/b/c" ("/" stays).
std::string without_trailing_slash(const std::string& path);

// --- reading -------------------------------------------------------------------------------------

// The whole file.
std::string read_file(const std::string& path);
// A file read by ranges (pread), open for the life of the object.
class FileReader {
 public:
  // `context` (say "tensor 'w'"), when given, joins the path in the error when it cannot open.
  explicit FileReader(std::string path, const std::string& context = {});
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // Exactly `n` bytes at `offset` (looping over EINTR and short reads); false when the file
  // ends first.
  bool read_at(void* data, int64_t n, int64_t offset);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// --- writing -------------------------------------------------------------------------------------

// A file written front to back: creates (or truncates) `path`; close() flushes it to the disk
// (fsync) and closes it. Dropped without close() (an error elsewhere), the descriptor is closed
// and the file is whatever was written: write it under a staging name and publish() it.
class FileWriter {
 public:
  explicit FileWriter(std::string path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  // Every byte (looping over EINTR and short writes).
  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Bytes written so far: the offset of the next write.
  int64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }
  // fsync, then close.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  int64_t offset_ = 0;
};

// `bytes` as the file `path` (created or truncated), flushed to the disk.
void write_file(const std::string& path, std::string_view bytes);
// A copy of the regular file `from` at `to`, flushed to the disk.
void copy_file(const std::string& from, const std::string& to);
// fsync of a file, or of a directory (its entries: after a create, a rename or a removal).
void sync_path(const std::string& path);

// --- publishing ----------------------------------------------------------------------------------

// Moves a complete staged file or directory to its final name, atomically and durably: fsyncs
// `staged` (for a directory: its entries; the files inside must each have been flushed, as
// FileWriter::close and write_file do), renames it to `final_path`, and fsyncs the directory
// that holds `final_path`. `final_path` must not exist as a non-empty directory (rename(2)), nor
// as a device, named pipe or socket (IoError: rename would replace it); a symbolic link there is
// replaced by the entry, its target left alone. The one copy of the protocol every save of this
// library follows.
void publish(const std::string& staged, const std::string& final_path);
// A name of this process's own beside `final_path` to stage it under before publish:
// "<final_path>.tmp-<pid>-<n>", n counting this process's calls (a user's "<final_path>.tmp" is
// never a save's).
std::string staging_path(const std::string& final_path);
// publish's check of `final_path` alone, for a save to make before it writes anything (IoError
// when a device, named pipe or socket holds it).
void check_publishable(const std::string& final_path);

}  // namespace fsdp::io
