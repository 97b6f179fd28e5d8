// Must build: the control case. A layer sees its own headers and those of every layer below, so
// the failures of the other three files come from the layering and not from the set-up.
#include "nanoddp/comm/ddp.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/kernels/types.h"
#include "nanoddp/nn/module.h"
