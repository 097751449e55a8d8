// Test helpers of the multi-process tests: a small job config, keys, a coordinator and clients
// of the real `fedfleet` program on tcp://127.0.0.1, and the history they write.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet::testing {

inline const std::string kBinary = FEDFLEET_BINARY;

// A small, fast job: MLP on 6000 training / 2000 test samples.
inline std::string writeConfig(const std::string& dir, const std::string& extra) {
  std::string path = dir + "/job.toml";
  std::ofstream(path) << R"([run]
name = "it"
seed = 3
[model]
name = "mlp"
[data]
partition = "dirichlet"
alpha = 0.5
train_subset = 6000
test_subset = 2000
[train]
epochs = 1
batch = 32
lr = 0.05
)" << extra;
  return path;
}

// The [coordinator] section of a test job; `more` adds lines to it.
inline std::string coordinatorSection(int clients_per_round, int min_clients, int quorum,
                                      int deadline_s, const std::string& more = "") {
  return "[coordinator]\nclients_per_round = " + std::to_string(clients_per_round) +
         "\nmin_clients = " + std::to_string(min_clients) + "\nquorum = " + std::to_string(quorum) +
         "\ndeadline_s = " + std::to_string(deadline_s) + "\n" + more + "\n";
}

inline int keygen(const std::string& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {kBinary, "keygen", "--dir", dir};
  args.insert(args.end(), extra.begin(), extra.end());
  Process p(args, dir + ".keygen.log");
  if (!p.started()) return -1;
  auto rc = p.waitFor(30);
  return rc ? *rc : -1;
}

inline std::unique_ptr<Process> startCoordinator(const std::string& dir, const std::string& config,
                                                 const std::vector<std::string>& extra,
                                                 std::string* endpoint) {
  std::vector<std::string> args = {
      kBinary,  "coordinator",       "--config",        config,
      "--bind", "tcp://127.0.0.1:*", "--keys",          dir + "/keys",
      "--db",   dir + "/history.db", "--endpoint-file", dir + "/endpoint"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto p = std::make_unique<Process>(args, dir + "/coordinator.log");
  *endpoint = waitForEndpoint(dir + "/endpoint", 60);
  return p;
}

inline std::unique_ptr<Process> startClient(const std::string& dir, const std::string& config,
                                            const std::string& endpoint, const std::string& id,
                                            const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {kBinary,         "client",      "--config",    config,
                                   "--coordinator", endpoint,      "--id",        id,
                                   "--keys",        dir + "/keys", "--exit-idle", "60"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(args, dir + "/" + id + ".log");
}

// Clients "client-1" .. "client-`n`" of the job, started in that order.
inline std::vector<std::unique_ptr<Process>> startClients(const std::string& dir,
                                                          const std::string& config,
                                                          const std::string& endpoint, int n) {
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 1; i <= n; ++i) {
    clients.push_back(startClient(dir, config, endpoint, "client-" + std::to_string(i)));
  }
  return clients;
}

inline std::unique_ptr<history::HistoryStore> openHistory(const std::string& dir) {
  auto h = history::openSqliteHistory(dir + "/history.db");
  EXPECT_TRUE(h.isOk()) << h.status().toString();
  return h.isOk() ? std::move(h).value() : nullptr;
}

inline bool hasEvent(const std::vector<history::EventRecord>& events, const std::string& kind,
                     const std::string& needle = "") {
  return std::any_of(events.begin(), events.end(), [&](const history::EventRecord& e) {
    return e.kind == kind && (needle.empty() || e.detail.find(needle) != std::string::npos);
  });
}

// Runs a whole job: a coordinator with `coordinator_extra` flags and `clients` clients
// (client i, from 1, with client_extra(i) flags), until the coordinator finishes; then waits for
// the clients to exit.
inline ::testing::AssertionResult runJob(
    const std::string& dir, const std::string& config, int clients,
    const std::vector<std::string>& coordinator_extra,
    const std::function<std::vector<std::string>(int)>& client_extra = nullptr) {
  std::string endpoint;
  auto coord = startCoordinator(dir, config, coordinator_extra, &endpoint);
  if (endpoint.empty()) return ::testing::AssertionFailure() << coord->log();
  std::vector<std::unique_ptr<Process>> procs;
  for (int i = 1; i <= clients; ++i) {
    procs.push_back(startClient(dir, config, endpoint, "client-" + std::to_string(i),
                                client_extra ? client_extra(i) : std::vector<std::string>{}));
  }
  auto rc = coord->waitFor(240);
  if (!rc.has_value()) {
    return ::testing::AssertionFailure() << "coordinator did not finish\n" << coord->log();
  }
  if (*rc != 0) return ::testing::AssertionFailure() << coord->log();
  for (auto& c : procs) c->waitFor(20);
  return ::testing::AssertionSuccess();
}

}  // namespace fedfleet::testing
