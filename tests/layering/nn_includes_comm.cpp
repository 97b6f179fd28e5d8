// Must NOT build: nn sits below comm (tests/layering/check.sh).
#include "nanoddp/comm/ddp.h"
