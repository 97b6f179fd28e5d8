#pragma once
// The root of every exception nanoddp throws, so `catch (const nanoddp::Error&)` catches every
// library failure: what a user did wrong, what the system refused, what a device or a peer did.
// Messages say what was wrong, with which value, and what to do about it.
//
//   Error                 bad input, refused settings, file formats (nanoddp::fail)
//   ├── CudaError         a CUDA or cuBLAS call failed (kernels/cuda/check.h: call, file, line)
//   ├── CommError         a collective failed or timed out (comm/process_group.h)
//   │   └── ShmError      the shared-memory all-reduce could not be set up (comm/shm_allreduce.h)
//   ├── PeerFailedError   another rank failed and said so: this one stops too
//   │                     (comm/process_group.h)
//   └── StoreError        the rendezvous store is unreachable, refused us, or timed out
//                         (comm/store.h)
//
// It lives in the lowest layer so that every layer can throw it.

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace nanoddp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Declared here, not beside the CUDA checks, so that a program can catch it without the CUDA
// toolkit's headers.
class CudaError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nanoddp

// Internal invariant or argument check: the message is formatted only on failure.
#define NANODDP_CHECK(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) ::nanoddp::fail("{} ({}:{})", fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
