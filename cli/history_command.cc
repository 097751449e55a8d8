#include "cli/history_command.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "cli/history_open.h"
#include "cli/report.h"
#include "common/history/format.h"
#include "common/history/history.h"
#include "common/history/peer_summary.h"
#include "common/history/tier_summary.h"

namespace fedfleet::cli {

int runHistoryCommand(const HistoryArgs& args) {
  constexpr const char* kCommand = "history";
  auto fmt = history::parseFormat(args.format);
  if (!fmt.isOk()) {
    std::cerr << "fedfleet history: " << fmt.status().message() << "\n";
    return 2;
  }
  int exit_code = 0;
  auto store = openExisting(args.db, kCommand, &exit_code);
  if (!store) return exit_code;
  auto runs = store->runs();
  if (failed(runs, kCommand)) return 1;
  if (args.run > 0 && !knownRun(*runs, args.run, args.db, kCommand)) return 2;
  const std::optional<int64_t> run_filter =
      args.run > 0 ? std::optional<int64_t>(args.run) : std::nullopt;

  if (args.what == "runs") {
    std::vector<history::RunRecord> rows;
    for (const auto& r : *runs) {
      if (!run_filter || r.run_id == *run_filter) rows.push_back(r);
    }
    std::cout << history::formatRuns(rows, *fmt);
    return 0;
  }
  if (args.what == "clients") {
    auto clients = store->clients();
    if (failed(clients, kCommand)) return 1;
    std::vector<history::ClientRecord> rows;
    if (run_filter) {
      auto updates = store->updates(*run_filter, std::nullopt);
      if (failed(updates, kCommand)) return 1;
      std::set<std::string> in_run;
      for (const auto& u : *updates) in_run.insert(u.client_id);
      for (const auto& c : *clients) {
        if (in_run.count(c.client_id)) rows.push_back(c);
      }
    } else {
      rows = std::move(*clients);
    }
    std::cout << history::formatClients(rows, *fmt);
    return 0;
  }
  if (args.what == "events") {
    auto events = store->events(run_filter);
    if (failed(events, kCommand)) return 1;
    std::set<int64_t> virtual_clock;
    for (const auto& r : *runs) {
      if (r.clock == "virtual") virtual_clock.insert(r.run_id);
    }
    std::cout << history::formatEvents(*events, *fmt, virtual_clock);
    return 0;
  }

  // rounds, updates, tiers, blocks, served, peers and peer-evals: one run, the latest by default.
  if (runs->empty()) {
    std::cerr << "fedfleet history: " << args.db << " holds no runs\n";
    return 1;
  }
  const int64_t run = run_filter.value_or(runs->back().run_id);
  if (args.what == "tiers") {
    auto updates = store->updates(run, std::nullopt);
    if (failed(updates, kCommand)) return 1;
    auto clients = store->clients();
    if (failed(clients, kCommand)) return 1;
    std::cout << history::formatTiers(run, history::summarizeTiers(*updates, *clients), *fmt);
    return 0;
  }
  if (args.what == "blocks") {
    auto rows = store->blockMetrics(run);
    if (failed(rows, kCommand)) return 1;
    std::cout << history::formatBlockMetrics(*rows, *fmt);
    return 0;
  }
  if (args.what == "peers") {
    auto rows = store->peerIterations(run);
    if (failed(rows, kCommand)) return 1;
    std::cout << history::formatPeers(run, history::summarizePeers(*rows), *fmt);
    return 0;
  }
  if (args.what == "peer-evals") {
    auto rows = store->peerEvals(run);
    if (failed(rows, kCommand)) return 1;
    std::cout << history::formatPeerEvals(*rows, *fmt);
    return 0;
  }
  if (args.what == "updates" || args.what == "served") {
    auto updates = store->updates(run, args.what == "updates" ? args.round : std::nullopt);
    if (failed(updates, kCommand)) return 1;
    std::cout << (args.what == "updates" ? history::formatUpdates(*updates, *fmt)
                                         : history::formatServed(*updates, *fmt));
    return 0;
  }
  auto rounds = store->rounds(run);
  if (failed(rounds, kCommand)) return 1;
  std::cout << history::formatRounds(*rounds, *fmt);
  return 0;
}

int runReportCommand(const ReportArgs& args) {
  constexpr const char* kCommand = "report";
  int exit_code = 0;
  auto store = openExisting(args.db, kCommand, &exit_code);
  if (!store) return exit_code;
  auto runs = store->runs();
  if (failed(runs, kCommand)) return 1;
  if (runs->empty()) {
    std::cerr << "fedfleet report: " << args.db << " holds no runs\n";
    return 1;
  }
  for (int64_t run : args.runs) {
    if (!knownRun(*runs, run, args.db, kCommand)) return 2;
  }
  if (auto reason = unwritableReason(args.output)) {
    std::cerr << "fedfleet report: cannot write " << args.output << ": " << *reason << "\n";
    return 1;
  }
  ReportOptions options;
  options.title = "fedfleet report: " + std::filesystem::path(args.db).filename().string();
  options.runs = args.runs;
  options.timeline_round = args.timeline_round;
  auto html = renderReport(*store, options);
  if (failed(html, kCommand)) return 1;
  // Written next to the target and renamed, so a reader never sees half a report.
  const std::string tmp = args.output + ".tmp";
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << *html;
    out.close();
    if (!out) {
      std::cerr << "fedfleet report: cannot write " << tmp << ": "
                << (errno != 0 ? std::strerror(errno) : "write failed") << "\n";
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return 1;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, args.output, ec);
  if (ec) {
    std::cerr << "fedfleet report: cannot write " << args.output << ": " << ec.message() << "\n";
    std::filesystem::remove(tmp, ec);
    return 1;
  }
  std::cout << "report: " << std::filesystem::absolute(args.output).string() << "\n";
  return 0;
}

}  // namespace fedfleet::cli
