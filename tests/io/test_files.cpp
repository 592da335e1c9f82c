// The file layer every save of the library writes through (fsdp/io/files.h): whole writes
// through interrupted and short write(2) calls, reads by range, the atomic publish of files and
// directories, and errors that name the path and the reason.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/io/files.h"
#include "support/expect_error.h"

namespace fsdp::testing {
namespace {

std::string scratch(const std::string& tag) {
  const std::string dir = "/tmp/fsdp_files_" + tag + "_" + std::to_string(::getpid());
  io::remove_tree(dir);
  io::make_directories(dir);
  return dir;
}

TEST(Files, WriteReadAndRanges) {
  const auto dir = scratch("rw");
  const std::string path = dir + "/a.bin";
  io::FileWriter out(path);
  out.write(std::string("hello "));
  EXPECT_EQ(out.offset(), 6);
  out.write("world", 5);
  EXPECT_EQ(out.offset(), 11);
  out.close();
  out.close();  // a second close is a no-op
  EXPECT_EQ(io::read_file(path), "hello world");
  io::FileReader in(path);
  char buf[5];
  ASSERT_TRUE(in.read_at(buf, 5, 6));
  EXPECT_EQ(std::string(buf, 5), "world");
  EXPECT_FALSE(in.read_at(buf, 5, 8)) << "past the end";
  io::write_file(path, "x");  // truncates
  EXPECT_EQ(io::read_file(path), "x");
  io::copy_file(path, dir + "/b.bin");
  EXPECT_EQ(io::read_file(dir + "/b.bin"), "x");
  io::remove_tree(dir);
  EXPECT_FALSE(io::path_exists(dir));
}

TEST(Files, Paths) {
  EXPECT_EQ(io::parent_directory("a/b/c"), "a/b");
  EXPECT_EQ(io::parent_directory("a/b/c/"), "a/b");
  EXPECT_EQ(io::parent_directory("c"), ".");
  EXPECT_EQ(io::parent_directory("/c"), "/");
  EXPECT_EQ(io::without_trailing_slash("a/b//"), "a/b");
  EXPECT_EQ(io::without_trailing_slash("/"), "/");
  const auto dir = scratch("paths");
  io::make_directories(dir + "/x/y/z");
  EXPECT_TRUE(io::is_directory(dir + "/x/y/z"));
  io::write_file(dir + "/x/f", "");
  auto names = io::list_directory(dir + "/x");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"f", "y"}));
  EXPECT_TRUE(io::list_directory(dir + "/none").empty());
  io::remove_tree(dir);
}

// A staged directory becomes the final one whole; the staged name is gone. Over a directory
// that holds something, the rename fails, naming both paths, and nothing moves.
TEST(Files, PublishIsARenameOfTheCompleteStagedEntry) {
  const auto dir = scratch("publish");
  const std::string staged = dir + "/.tmp-out", final_dir = dir + "/out";
  io::make_directories(staged);
  io::write_file(staged + "/data", "123");
  io::publish(staged, final_dir);
  EXPECT_FALSE(io::path_exists(staged));
  EXPECT_EQ(io::read_file(final_dir + "/data"), "123");
  // A file the same way.
  io::write_file(dir + "/f.tmp", "abc");
  io::publish(dir + "/f.tmp", dir + "/f");
  EXPECT_EQ(io::read_file(dir + "/f"), "abc");
  EXPECT_FALSE(io::path_exists(dir + "/f.tmp"));
  // Never over something a user saved.
  io::make_directories(staged);
  io::write_file(staged + "/data", "456");
  expect_error_containing<IoError>([&] { io::publish(staged, final_dir); },
                                   "cannot rename " + staged + " to " + final_dir);
  EXPECT_EQ(io::read_file(final_dir + "/data"), "123");
  EXPECT_EQ(io::read_file(staged + "/data"), "456");
  io::remove_tree(dir);
}

// A name taken by a device, pipe or socket is not replaced (as root, an export to /dev/full
// replaced the device with the model): refused, naming it, and both entries stay.
TEST(Files, PublishDoesNotReplaceAPipeOrADevice) {
  const auto dir = scratch("publish_special");
  ASSERT_EQ(::mkfifo((dir + "/pipe").c_str(), 0600), 0) << std::strerror(errno);
  io::write_file(dir + "/f.tmp", "abc");
  expect_error_containing<IoError>([&] { io::publish(dir + "/f.tmp", dir + "/pipe"); },
                                   "cannot write " + dir + "/pipe: it is a named pipe");
  struct stat st {};
  ASSERT_EQ(::lstat((dir + "/pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(io::read_file(dir + "/f.tmp"), "abc");
  io::remove_tree(dir);
}

TEST(Files, ErrorsNameThePathAndTheReason) {
  expect_error_containing<IoError>([] { io::FileWriter("/nonexistent/dir/x"); },
                                   "cannot create /nonexistent/dir/x: No such file or directory");
  expect_error_containing<IoError>([] { io::read_file("/nonexistent/y"); },
                                   "cannot read /nonexistent/y: No such file or directory");
  expect_error_containing<IoError>([] { io::FileReader("/nonexistent/z", "tensor 'w'"); },
                                   "cannot open /nonexistent/z (tensor 'w'): No such file");
  expect_error_containing<IoError>([] { io::make_directories("/proc/self/nope/x"); },
                                   "cannot create directory /proc/self/nope");
  expect_error_containing<IoError>([] { io::sync_path("/nonexistent/w"); },
                                   "cannot open /nonexistent/w");
}

void on_alarm(int) {}

// Every byte arrives, in order, although write(2) is interrupted by a signal every 100 us
// (installed without SA_RESTART: the call returns EINTR, or a short count when some bytes were
// already taken) while a slow reader drains a FIFO a page at a time.
TEST(Files, WritesEveryByteThroughInterruptsAndShortWrites) {
  const auto dir = scratch("fifo");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<char> data(4 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131 + 7) % 251);

  // SIGALRM reaches the writing thread only: every other thread blocks it.
  sigset_t alarm_only;
  sigemptyset(&alarm_only);
  sigaddset(&alarm_only, SIGALRM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &alarm_only, nullptr), 0);
  struct sigaction action {};
  action.sa_handler = on_alarm;  // no SA_RESTART
  struct sigaction previous {};
  ASSERT_EQ(::sigaction(SIGALRM, &action, &previous), 0);

  std::vector<char> received;
  std::thread reader([&] {
    int fd = ::open(fifo.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char page[4096];
    for (;;) {
      const ssize_t r = ::read(fd, page, sizeof(page));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      received.insert(received.end(), page, page + r);
      ::usleep(20);
    }
    ::close(fd);
  });
  std::string error;
  std::thread writer([&] {
    pthread_sigmask(SIG_UNBLOCK, &alarm_only, nullptr);
    itimerval every{{0, 100}, {0, 100}};
    ::setitimer(ITIMER_REAL, &every, nullptr);
    try {
      io::FileWriter out(fifo);             // a FIFO: no fsync (close() would ask for one); the
      out.write(data.data(), data.size());  // destructor closes it
    } catch (const std::exception& e) {
      error = e.what();
    }
    itimerval off{};
    ::setitimer(ITIMER_REAL, &off, nullptr);
  });
  writer.join();
  reader.join();
  ::sigaction(SIGALRM, &previous, nullptr);
  pthread_sigmask(SIG_UNBLOCK, &alarm_only, nullptr);
  EXPECT_EQ(error, "");
  ASSERT_EQ(received.size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), received.begin()));
  io::remove_tree(dir);
}

}  // namespace
}  // namespace fsdp::testing
