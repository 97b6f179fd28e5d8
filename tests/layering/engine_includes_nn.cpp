// Must NOT build: engine sits below nn (tests/layering/check.sh).
#include "nanoddp/nn/module.h"
