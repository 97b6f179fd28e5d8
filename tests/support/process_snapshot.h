#pragma once
// What a program under test was doing when a test gave up on it: for every process of its
// process group (the tests start each program in a group of its own), each thread's name, state,
// the system call it is in and the kernel function it sleeps in, from /proc; with gdb installed
// and allowed to attach, the threads' stacks too. A flaky timeout in CI then says where the
// program was stuck instead of only that it was.

#include <sys/types.h>

#include <string>

namespace nanoddp::testing {

std::string snapshot_process_group(pid_t group);

}  // namespace nanoddp::testing
