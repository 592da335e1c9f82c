// Declarations (no definitions) of the gloo names that c10d's ProcessGroupGloo.hpp mentions.
//
// PyTorch's wheels compile gloo into libtorch_cpu but ship none of gloo's headers, while
// ProcessGroupGloo.hpp includes five of them. Every gloo type in that header sits behind a
// pointer (shared_ptr, unique_ptr) or in an inline member this project never calls, so what the
// header needs from gloo is the names, not the classes' contents: sizeof(ProcessGroupGloo) and
// its Options come out the same as in libtorch, and every call lands in libtorch_cpu's own gloo.
// Nothing here is ever defined or instantiated by this project: a missing or mismatched name is
// a compile error, never a silent layout difference. See ../README.md.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);  // named by ProcessGroupGloo::setTimeout
};

namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport

namespace rendezvous {
// The base of c10d's GlooStore adapter: the virtuals it overrides. GLOO_STORE_HAS_STORE_V2 is
// left undefined, so the adapter's multi-key overrides are not compiled here.
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous

}  // namespace gloo
