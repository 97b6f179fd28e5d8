#pragma once
// A free TCP port for rank 0's store on a single-node run.

#include <string>

namespace nanoddp::run {

// Binds port 0 on `address` (so the kernel picks an unused port), reads the port and closes the
// socket. This is racy by nature: between this close and rank 0's bind another process may take
// the port. The window is a few milliseconds, the kernel hands out ephemeral ports in a moving
// sequence, and the store binds with SO_REUSEADDR, so in practice a collision is rare; a job that
// must never collide passes --master-port. Throws std::runtime_error naming the address.
int find_free_port(const std::string& address);

}  // namespace nanoddp::run
