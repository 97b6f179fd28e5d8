#pragma once
// Checks that every rank holds the same description of something (the model's parameters, the
// training configuration) before any collective depends on it.
//
// Why: ranks that disagree — a different model, a different batch size, a different bucket
// cap — issue different collectives, and the symptom is a hang or a crash deep inside an
// all-reduce. PyTorch learned to all-gather parameter shapes first; this does the same through
// the store, and every rank fails with the same message naming the first difference and which
// ranks hold which value.

#include <string>
#include <vector>

#include "nanoddp/comm/store.h"

namespace nanoddp::comm {

// Publishes `value` under `key` for this rank and returns every rank's (index = rank): the
// exchange check_same_on_all_ranks makes, for a caller whose disagreement needs its own message.
std::vector<std::string> exchange_on_all_ranks(Store& store, int rank, int size,
                                               const std::string& key, const std::string& value);

// Publishes `items` under `key` for this rank, reads every rank's, and throws nanoddp::Error on
// every rank if they differ. `what` names the items in the message ("parameter", "setting"): the
// first item that differs with every rank's value, and the positions of the others. Where more
// than half the ranks hold the same list, the others are named as the odd ones out, and the
// ranks of that majority throw PeerFailedError (naming the lowest odd rank), the rest
// nanoddp::Error.
void check_same_on_all_ranks(Store& store, int rank, int size, const std::string& key,
                             const std::string& what, const std::vector<std::string>& items);

}  // namespace nanoddp::comm
