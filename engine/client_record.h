// The history's row of a client (the clients table), from what its Hello says: the coordinator's
// engine and the simulator write the same row.
#pragma once

#include <cstdint>
#include <string>

#include "common/history/records.h"
#include "common/wire/messages.h"

namespace fedfleet::engine {

// data_size: what the client trains on (the coordinator's figure where it knows one); `now`
// is both first_seen and last_seen (the store keeps the first first_seen it was given).
history::ClientRecord clientRecordOf(const std::string& id, const wire::Hello& hello,
                                     uint64_t data_size, double now);

}  // namespace fedfleet::engine
