// Runs a fuzz target over files without libFuzzer: the regression test of the corpus each
// target keeps (fuzz/corpus/<target>/, inputs that once crashed or cover its branches).
//   fuzz_<target> FILE_OR_DIR...
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// POSIX directory listing: libtorch.so exports its own std::filesystem (docs/libtorch.md).
std::vector<std::string> files_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> out;
  if (DIR* dir = opendir(path.c_str())) {
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(path + "/" + name);
    }
    closedir(dir);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    const auto files = files_of(argv[i]);
    if (files.empty()) {
      std::fprintf(stderr, "replay: %s: no such file or an empty directory\n", argv[i]);
      return 2;
    }
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++runs;
    }
  }
  std::printf("replay: %d inputs ran without a crash\n", runs);
  return 0;
}
