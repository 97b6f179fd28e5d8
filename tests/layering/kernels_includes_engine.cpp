// Must NOT build: kernels sit below engine (tests/layering/check.sh).
#include "nanoddp/engine/tensor.h"
