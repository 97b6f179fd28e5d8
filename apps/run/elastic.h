#pragma once
// nanoddp-run's elastic agent (--rdzv-endpoint HOST:PORT, --nnodes MIN:MAX): the launchers of all
// nodes meet in a store, agree on a round's members and node ranks, and start that round's
// workers together; a failure anywhere ends the round on every node, and the next round starts
// on every surviving node while restarts remain. What torchrun's elastic agent does with its
// c10d rendezvous, in C++ and small.
//
// The store: the launcher on HOST serves it (a TcpStoreServer on HOST:PORT, NANODDP_STORE_TOKEN
// as its secret); every launcher, that one included, is a client. It serves one job: the first
// launcher writes its --rdzv-id at "nanoddp-run/job" (another id is refused, exit 2: the store
// goes when the job that started it ends), and the job's settings at "nanoddp-run/<id>/settings"
// (a launcher whose settings differ is refused, exit 2, naming them). A launcher that has not
// been a member yet is refused (exit 1) when a round of MAX nodes runs or the job is over; none
// of these refusals writes a key the job reads. Its keys, per round R, under
// "nanoddp-run/<--rdzv-id>/rR/":
//   arrivals      the count of launchers that joined; a launcher's arrival index is its node rank
//   node/K        node K's address (towards HOST) and its --nproc-per-node
//   closed        the round's size: written once (compare-and-set) by the first launcher that sees
//                 MAX arrivals, or MIN arrivals and --rdzv-last-call seconds (at least two
//                 intervals) since the last one; never before round R-1 has ended. A launcher
//                 that arrived after it waits for R+1. A member of round R-1 arrives as soon as
//                 it sees R-1's end, before its workers have stopped, so the survivors arrive
//                 together (a slow one would otherwise miss the round, and the next, ...)
//   record        by node 0: the workers' store port and secret, and the restarts used so far;
//                 "0 <restarts> -" (never started) when its node 0 died before writing it, written
//                 by a node that waited T for it, or by a waiting launcher that found every node
//                 of the round silent for T (the first writer wins); such a round ends as failed
//   hb/K          node K's heartbeat, a counter raised every interval (heartbeat_interval())
//   done/K left/K node K's workers all exited 0 / node K's launcher is leaving (not lost)
//   fail/K over/K node K's own failure ('F' or 'U', written at once) / its workers have all ended
//   end           why the round ended, written once (compare-and-set): "F|..." a failure (a
//                 worker exited non-zero, a node lost, a launcher stopped), which uses a restart;
//                 "U|..." a worker exited 2, a usage error that ends the job with exit 2 unless
//                 another node failed or was lost (then as "F"), decided once in "verdict";
//                 "M|..." a node waits to join (MIN..MAX allows it), which does not; "S|..."
//                 every node finished.
// Restart counts are agreed: node 0 of round R derives them from round R-1's record and end.
//
// The bound: a node whose heartbeat has not changed for --heartbeat-timeout T seconds (as seen
// by another launcher's clock) is lost; every launcher checks the others, and "end", every
// interval I = min(1 s, T / 5). So a round ends on every node within T + 2 I after a node is
// lost, within I after a worker fails anywhere, and the workers are then stopped within
// --grace-period. A round whose every node is lost is ended by a launcher waiting for the next
// (a standby), when it has seen all their beats stand still for T.

#include "launcher.h"

namespace nanoddp::run {

// The launcher's exit code, as run_launcher()'s; 1 when the job fails for a reason outside this
// node's workers (a lost node, the store gone, a rendezvous that did not complete).
int run_elastic(const LaunchPlan& plan);

}  // namespace nanoddp::run
