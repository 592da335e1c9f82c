// Links against the installed library and runs one collective in a single-process world.
#include <fsdp/fsdp.h>

#include <iostream>

int main() {
  auto d = fsdp::init_from_env();
  auto t = at::full({4}, 2.0);
  d.group->all_reduce(t, fsdp::ReduceOp::kAvg)->wait();
  std::cout << "consumer: backend " << d.group->backend_name() << ", world " << d.group->size()
            << ", value " << t[0].item<float>() << "\n";
  return t[0].item<float>() == 2.0f ? 0 : 1;
}
