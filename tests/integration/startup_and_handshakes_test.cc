// A coordinator as an operator meets it: one that cannot start (no keys, a secret key open to
// others, a port in use) leaves no history behind, and connections refused at the handshake (a
// plain-text client, one holding another coordinator's public key) show on the coordinator as
// one warning and one event per cause and address, however often they retry.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "common/history/history.h"
#include "tests/integration/coordinator_fixture.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
using testing::kBinary;
using testing::keygen;
using testing::Process;

std::vector<std::string> coordinatorArgs(const std::string& dir, const std::string& keys,
                                         int port) {
  return {kBinary,  "coordinator",
          "--keys", keys,
          "--db",   dir + "/history.db",
          "--bind", "tcp://127.0.0.1:" + std::to_string(port),
          "--set",  "data.train_subset=2000",
          "--set",  "data.test_subset=500"};
}

TEST(CoordinatorStartup, AFailedStartLeavesNoHistoryBehind) {
  const std::string dir = testing::freshDir("startup-no-history");
  const int port = testing::freeLoopbackPort();
  ASSERT_GT(port, 0);

  // No key pair at all.
  {
    Process p(coordinatorArgs(dir, dir + "/nokeys", port), dir + "/nokeys.log");
    EXPECT_NE(p.waitFor(60).value_or(0), 0) << p.log();
    EXPECT_THAT(p.log(), HasSubstr("fedfleet keygen --dir " + dir + "/nokeys --coordinator"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/history.db"));
  }
  // A secret key others may read.
  ASSERT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", "1"}), 0);
  std::filesystem::permissions(dir + "/keys/coordinator.key_secret",
                               std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  {
    Process p(coordinatorArgs(dir, dir + "/keys", port), dir + "/mode.log");
    EXPECT_NE(p.waitFor(60).value_or(0), 0) << p.log();
    EXPECT_THAT(p.log(), HasSubstr("chmod"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/history.db"));
  }
  std::filesystem::permissions(dir + "/keys/coordinator.key_secret",
                               std::filesystem::perms::others_read,
                               std::filesystem::perm_options::remove);
  // The port taken by another listener.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  {
    Process p(coordinatorArgs(dir, dir + "/keys", port), dir + "/port.log");
    EXPECT_NE(p.waitFor(60).value_or(0), 0) << p.log();
    EXPECT_THAT(p.log(), HasSubstr(std::to_string(port)));
    EXPECT_FALSE(std::filesystem::exists(dir + "/history.db"));
  }
  ::close(fd);
}

int rowsWith(const std::vector<history::EventRecord>& events, const std::string& kind,
             const std::string& needle) {
  int n = 0;
  for (const auto& e : events) n += e.kind == kind && e.detail.find(needle) != std::string::npos;
  return n;
}

TEST(CoordinatorHandshakes, RefusedHandshakesAreOneWarningAndOneEventPerCauseAndAddress) {
  const std::string dir = testing::freshDir("refused-handshakes");
  ASSERT_EQ(keygen(dir + "/keys", {"--coordinator", "--clients", "2"}), 0);
  // A client that holds another coordinator's public key (its own key pair is allowed).
  ASSERT_EQ(keygen(dir + "/other", {"--coordinator"}), 0);
  for (const char* f : {"client-1.key", "client-1.key_secret"}) {
    std::filesystem::copy_file(dir + "/keys/" + f, dir + "/other/" + f);
  }
  const std::string config =
      testing::writeConfig(dir, testing::coordinatorSection(2, 2, 1, 30, "wait_clients_s = 120"));
  std::string endpoint;
  auto coord = testing::startCoordinator(dir, config, {}, &endpoint);
  ASSERT_FALSE(endpoint.empty()) << coord->log();

  Process wrong_key({kBinary, "client", "--config", config, "--coordinator", endpoint, "--id",
                     "client-1", "--keys", dir + "/other", "--exit-idle", "12"},
                    dir + "/wrong-key.log");
  Process plain({kBinary, "client", "--config", config, "--coordinator", endpoint, "--id",
                 "client-2", "--insecure", "--exit-idle", "12"},
                dir + "/plain.log");
  EXPECT_TRUE(coord->waitForLog("another coordinator public key", 30)) << coord->log();
  EXPECT_TRUE(coord->waitForLog("insecure", 30)) << coord->log();
  // Both clients keep retrying (many handshakes each) until they give up.
  wrong_key.waitFor(60);
  plain.waitFor(60);
  coord->kill(SIGINT);
  EXPECT_EQ(coord->waitFor(60).value_or(-1), 130) << coord->log();

  const std::string log = coord->log();
  EXPECT_THAT(log, HasSubstr("warning event handshake_refused: CURVE handshake failed: the "
                             "client holds another coordinator public key"));
  auto store = history::openSqliteHistoryReadOnly(dir + "/history.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const auto events = (*store)->events(std::nullopt).value();
  // At least one row per cause, and not one per retry: within the minute one row per cause
  // and address (127.0.0.1, or "an address not known" for a connection closed before its
  // address could be read; the plain-text client shows as two causes, "plain text" and "closed
  // the connection during the CURVE handshake"), and at the stop one row per cause and address
  // counting the repeats ("N more from ADDRESS: ..."). So no row's text comes twice, and both
  // clients, each retrying dozens of times, leave at most 3 causes x 2 addresses x 2 rows.
  std::set<std::string> details;
  int rows = 0;
  for (const auto& e : events) {
    if (e.kind != "handshake_refused") continue;
    ++rows;
    EXPECT_TRUE(details.insert(e.detail).second) << "twice: " << e.detail;
  }
  EXPECT_LE(rows, 12);
  EXPECT_GE(rowsWith(events, "handshake_refused", "another coordinator public key"), 1);
  EXPECT_EQ(rowsWith(events, "handshake_refused",
                     "another coordinator public key (give it this coordinator's "
                     "keys/coordinator.key) (from 127.0.0.1)"),
            1);
  EXPECT_GE(rowsWith(events, "handshake_refused", "insecure"), 1);
  // The client with the wrong key says so once as a warning, then at info level.
  const std::string client_log = wrong_key.log();
  EXPECT_THAT(client_log, HasSubstr("wrong coordinator public key"));
  size_t warnings = 0;
  const std::string warned = "warning client client-1: coordinator silent";
  for (size_t at = client_log.find(warned); at != std::string::npos;
       at = client_log.find(warned, at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << client_log;
}

}  // namespace
}  // namespace fedfleet
