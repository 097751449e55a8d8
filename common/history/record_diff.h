// Whether a row written again is the row a history file holds: the first column, in the
// table's order, in which `replayed` differs from `recorded`, as "name: X recorded, Y replayed";
// empty when they are the same row. The columns are the SQLite schema's (one list for the file
// and the comparison); numbers compare bit for bit, and the columns measured on the wall clock
// (a round's wall_start and wall_end, an update's wall_compute_s, encode_s and decode_s) and row
// ids are passed over. A simulation resumed with --resume replays its run and checks each row.
#pragma once

#include <string>

#include "common/history/records.h"

namespace fedfleet::history {

std::string firstDifference(const RoundRecord& recorded, const RoundRecord& replayed);
std::string firstDifference(const UpdateRecord& recorded, const UpdateRecord& replayed);
std::string firstDifference(const EventRecord& recorded, const EventRecord& replayed);
std::string firstDifference(const BlockMetricRecord& recorded, const BlockMetricRecord& replayed);

}  // namespace fedfleet::history
