// Host memory for the emulated kernels' tensors whose end meets a page that can be neither read
// nor written, so that a kernel's access past the end of a buffer (an off-by-one in a tail, a
// pack read across the end), which host memory otherwise lets pass and a GPU may too, stops the
// test: the first such access raises SIGSEGV, which a handler turns into a message naming how
// far past which buffer's end it was, then aborts. (An access before the start is not caught.)
#pragma once

#include <cstddef>
#include <memory>

namespace cuda_emulator {

// `bytes` of memory ending exactly where the guard page begins (the start is then on a 16-byte
// boundary when `bytes` is a multiple of 16). Freed, the guard page with it, with the last owner.
std::shared_ptr<void> guarded_alloc(size_t bytes);

}  // namespace cuda_emulator
