#include "fsdp/io/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fsdp/errors.h"

namespace fsdp::io {
namespace {

// A single write or read is capped below 2 GiB: Linux moves at most 0x7ffff000 bytes per call.
constexpr int64_t kMaxCall = int64_t{1} << 30;

[[noreturn]] void fail(const char* what, const std::string& path) {
  throw IoError(fmt::format("cannot {} {}: {}", what, path, std::strerror(errno)));
}

int open_or_fail(const std::string& path, int flags, const char* what) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(what, path);
  return fd;
}

void write_all(int fd, const char* data, int64_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, static_cast<size_t>(std::min(n, kMaxCall)));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("write", path);
    if (w == 0) {
      errno = EIO;  // write(2) returning 0 for a non-zero count: no progress is possible
      fail("write", path);
    }
    data += w;
    n -= w;
  }
}

// Closes the descriptor however the scope ends.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : -1;
}

}  // namespace

// --- paths ---------------------------------------------------------------------------------------

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return names;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

void make_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_directories(path.substr(0, slash));
  if (::mkdir(path.c_str(), 0755) == 0) {
    sync_path(parent_directory(path));  // the new entry, durably
  } else if (errno != EEXIST) {
    fail("create directory", path);
  }
}

void remove_tree(const std::string& path) {
  if (!path_exists(path)) return;
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) fail("remove", path);
}

void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw IoError(fmt::format("cannot rename {} to {}: {}", from, to, std::strerror(errno)));
  }
}

std::string without_trailing_slash(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string parent_directory(const std::string& path) {
  const std::string p = without_trailing_slash(path);
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// --- reading -------------------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  Fd f{open_or_fail(path, O_RDONLY, "read")};
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t r = ::read(f.fd, buffer, sizeof(buffer));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("read", path);
    if (r == 0) break;
    text.append(buffer, static_cast<size_t>(r));
  }
  return text;
}

FileReader::FileReader(std::string path, const std::string& context) : path_(std::move(path)) {
  do {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const std::string where = context.empty() ? path_ : fmt::format("{} ({})", path_, context);
    throw IoError(fmt::format("cannot open {}: {}", where, std::strerror(errno)));
  }
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool FileReader::read_at(void* data, int64_t n, int64_t offset) {
  char* out = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, out, static_cast<size_t>(std::min(n, kMaxCall)), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("read", path_);
    if (r == 0) return false;
    out += r;
    n -= r;
    offset += r;
  }
  return true;
}

// --- writing -------------------------------------------------------------------------------------

FileWriter::FileWriter(std::string path) : path_(std::move(path)) {
  fd_ = open_or_fail(path_, O_WRONLY | O_CREAT | O_TRUNC, "create");
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  if (fd_ < 0) {
    errno = EBADF;
    fail("write (already closed)", path_);
  }
  write_all(fd_, static_cast<const char*>(data), static_cast<int64_t>(n), path_);
  offset_ += static_cast<int64_t>(n);
}

void FileWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    fail("fsync", path_);
  }
  if (::close(fd) != 0) fail("close", path_);
}

void write_file(const std::string& path, std::string_view bytes) {
  FileWriter out(path);
  out.write(bytes);
  out.close();
}

void copy_file(const std::string& from, const std::string& to) {
  Fd in{open_or_fail(from, O_RDONLY, "read")};
  FileWriter out(to);
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t r = ::read(in.fd, buffer.data(), buffer.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("read", from);
    if (r == 0) break;
    out.write(buffer.data(), static_cast<size_t>(r));
  }
  out.close();
}

void sync_path(const std::string& path) {
  Fd f{open_or_fail(path, O_RDONLY, "open")};
  if (::fsync(f.fd) != 0) fail("fsync", path);
}

// --- publishing ----------------------------------------------------------------------------------

void check_publishable(const std::string& final_path) {
  // rename(2) replaces whatever holds the final name: a device node, for root (an export to
  // /dev/full replaced the device with the model).
  struct stat existing {};
  if (::lstat(final_path.c_str(), &existing) == 0 &&
      !(S_ISREG(existing.st_mode) || S_ISDIR(existing.st_mode) || S_ISLNK(existing.st_mode))) {
    const char* kind = S_ISFIFO(existing.st_mode)   ? "named pipe"
                       : S_ISSOCK(existing.st_mode) ? "socket"
                                                    : "device";
    throw IoError(
        fmt::format("cannot write {}: it is a {}, which would be replaced; give the path of a file",
                    final_path, kind));
  }
}

std::string staging_path(const std::string& final_path) {
  static std::atomic<int> counter{0};
  return fmt::format("{}.tmp-{}-{}", final_path, ::getpid(), counter++);
}

void publish(const std::string& staged, const std::string& final_path) {
  check_publishable(final_path);
  // The staged entry's own contents first (a directory's entries), then the rename, then the
  // entry in the parent: after the last fsync the final name survives a power cut with every
  // byte behind it.
  sync_path(staged);
  rename_path(staged, final_path);
  sync_path(parent_directory(final_path));
}

}  // namespace fsdp::io
