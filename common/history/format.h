// Rendering history records for people and for other programs (`fedfleet history`, reports).
//
// Three formats, one function per record type:
//   kTable  aligned columns under a header line, for a terminal. Numbers are right-aligned and
//           rounded for reading (losses 4 decimals, seconds 2, accuracy as a percentage with 2
//           decimals, wall-clock times as UTC "YYYY-MM-DD HH:MM:SS", virtual-clock times as
//           seconds from the run's start, "t=64.00 s"); a missing value is "-"; control
//           characters in text are shown escaped (\n, \r, \t). Long fields (config_json,
//           public_key) are left out; use CSV or JSON for them.
//   kCsv    RFC 4180: a header line, then one line per record, every line ended by CRLF; a field
//           containing a comma, a double quote, CR or LF is quoted with its quotes doubled. All
//           record fields, numbers in full precision (shortest text that reads back to the same
//           double), a missing value as an empty field.
//   kJson   a JSON array of objects with the CSV's field names in the same order, indented by
//           two spaces, followed by a newline; missing values (and NaN) are null; text that is
//           not valid UTF-8 is written with U+FFFD in place of the bad bytes.
// Which clock a time is on: a real coordinator's run writes unix seconds, the fleet simulator's
// run (RunRecord::clock "virtual") seconds from the run's start. CSV and JSON write the number
// as stored either way; the table shows each time on its own clock:
//   events   the clock of the event's run; an event tied to no run (run_id 0) is from a real
//            coordinator, on the wall clock.
//   clients  the clients table is shared by every run and does not say which run wrote a time,
//            so each time is judged by its value: below kEarliestWallClockTime it cannot be a
//            fedfleet wall-clock time and is a virtual-clock time.
// The functions never throw and never fail: any record can be rendered in any format.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/history/history.h"
#include "common/history/peer_summary.h"
#include "common/history/tier_summary.h"
#include "common/status.h"

namespace fedfleet::history {

enum class Format { kTable, kCsv, kJson };

// 2001-09-09 01:46:40 UTC in unix seconds: older than any history a fedfleet coordinator wrote,
// and longer (31 years) than any simulated run.
inline constexpr double kEarliestWallClockTime = 1e9;

// "table", "csv" or "json" (exactly, lower case); anything else is kInvalidArgument naming the
// valid values.
Result<Format> parseFormat(std::string_view name);

// The metrics of one round for a log line, as the run has them: "test acc 81.23% loss 0.5123",
// a regression's "test loss 0.2101 mse 0.2101 mae 0.3640", a model's own metrics after them,
// and the clients' federated evaluation "fed acc 79.10% loss 0.6012 (federated, 12 clients)";
// "" when the round has none.
std::string roundMetricsText(const RoundRecord& r);

// Table columns: round, status, selected, completed, late, dropped, rejected, train_loss,
// test_loss, test_acc, bytes_up, bytes_down, seconds (end_time - start_time), wall_s. CSV and
// JSON: every field.
std::string formatRounds(const std::vector<RoundRecord>& rounds, Format format);
// Table columns: run_id, name, started_at, seed.
std::string formatRuns(const std::vector<RunRecord>& runs, Format format);
// Table columns: round, client_id, status, partition, n_samples, steps, loss, compute_s,
// upload_s, bytes_up, bytes_down, codec, weight, served ("b<block> <model> v<version>", "-"
// without one), served_acc. CSV and JSON: every field; served_* null without a served model.
std::string formatUpdates(const std::vector<UpdateRecord>& updates, Format format);
// Which model each client serves now and how good it is on the client's own held-out data:
// per client, its last update that names a served model (block-cyclic runs), by client_id.
// Table columns: client_id, round, block, model, version, sha256 (first 12 hex digits),
// samples, accuracy (percent), loss; CSV and JSON: run_id, client_id, round, block, model,
// version, sha256 (all of it), samples, loss, accuracy (a fraction; null when not evaluated).
std::string formatServed(const std::vector<UpdateRecord>& updates, Format format);
// Table columns: client_id, device_kind, device_name, cores, memory_bytes, data_size,
// first_seen, last_seen (each on the clock its value implies: see above).
std::string formatClients(const std::vector<ClientRecord>& clients, Format format);
// Table columns: run_id ("-" when not tied to a run), time (on the clock of the event's run:
// `virtual_clock_runs` holds the ids of the runs whose clock is "virtual"), kind, client_id,
// detail. An event with run_id 0 has an empty run_id in CSV and null in JSON.
std::string formatEvents(const std::vector<EventRecord>& events, Format format,
                         const std::set<int64_t>& virtual_clock_runs = {});
// Per-tier update counts of run `run_id` (common/history/tier_summary.h). Table columns: tier,
// device_kind, clients, updates, completed, late, dropped, rejected, late_or_dropped (percent
// of the updates), mean_completed_s. CSV and JSON: run_id, then every TierSummary field, and
// late_or_dropped as a fraction.
std::string formatTiers(int64_t run_id, const std::vector<TierSummary>& tiers, Format format);
// Table columns: round, block, model, accuracy (percent), loss; CSV and JSON: run_id, round,
// block, model, accuracy (a fraction), loss.
std::string formatBlockMetrics(const std::vector<BlockMetricRecord>& rows, Format format);
// Per-peer totals of decentralised run `run_id` (common/history/peer_summary.h). Table columns:
// peer, iterations, skipped, exchanges, bytes_sent, bytes_received, compute_s, comm_s, wait_s,
// mean_staleness, max_staleness, first_start, last_end (seconds from the run's start). CSV and
// JSON: run_id, then every PeerSummary field.
std::string formatPeers(int64_t run_id, const std::vector<PeerSummary>& peers, Format format);
// Evaluations of a decentralised run's averaged model. Table columns: time (seconds from the
// run's start), iterations, peers_averaged, accuracy (percent; "-" when NaN), loss. CSV and
// JSON: every field (accuracy a fraction; NaN empty or null).
std::string formatPeerEvals(const std::vector<PeerEvalRecord>& rows, Format format);

}  // namespace fedfleet::history
