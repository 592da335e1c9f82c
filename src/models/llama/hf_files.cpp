#include "models/llama/hf_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::models::llama::detail {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw CheckpointError(fmt::format("cannot {} {}: {}", what, path, std::strerror(errno)));
}

// Closes the descriptor however the scope ends.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write", path);
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::string read_text_file(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail("read", path);
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

void write_text_file(const std::string& path, const std::string& text) {
  Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) fail("create", path);
  write_all(f.fd, text.data(), text.size(), path);
  if (::fsync(f.fd) != 0) fail("fsync", path);
}

void copy_file(const std::string& from, const std::string& to) {
  Fd in{::open(from.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) fail("read", from);
  Fd out{::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (out.fd < 0) fail("create", to);
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t r = ::read(in.fd, buffer.data(), buffer.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("read", from);
    if (r == 0) break;
    write_all(out.fd, buffer.data(), static_cast<size_t>(r), to);
  }
  if (::fsync(out.fd) != 0) fail("fsync", to);
}

void fsync_path(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail("open", path);
  if (::fsync(f.fd) != 0) fail("fsync", path);
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

}  // namespace fsdp::models::llama::detail
