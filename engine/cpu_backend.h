#pragma once
// The CPU implementation of Backend (engine/backend.h): forwards every op to
// kernels/cpu on the calling thread. backend_for(Device::cpu()) returns this.

#include "nanoddp/engine/backend.h"

namespace nanoddp {

// The process-wide CPU backend (created on first use, never destroyed before exit).
Backend& cpu_backend();

}  // namespace nanoddp
