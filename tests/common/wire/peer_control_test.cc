// Tests of the decentralised control messages (common/wire/peer_control.h): every kind round
// trips, and bytes that break a bound (a hostile peer's) are refused with an error naming the
// field, never a crash.

#include "common/wire/peer_control.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace fedfleet::wire {
namespace {

const PeerControlLimits kLimits{6, 100};

PeerControl fullMessage() {
  PeerControl m;
  m.kind = PeerControlKind::kTable;
  m.endpoint = "tcp://127.0.0.1:40000";
  m.table = {{0, "tcp://127.0.0.1:1", std::string(40, 'a')}, {5, "tcp://127.0.0.1:2", ""}};
  PeerIteration it;
  it.iteration = 7;
  it.t_start = 1.5;
  it.t_end = 2.5;
  it.compute_s = 0.5;
  it.wait_s = 0.5;
  it.bytes_sent = 1000;
  it.bytes_received = 2000;
  it.exchanges = 3;
  it.staleness = 1;
  it.skipped = true;
  it.loss = 0.25;
  m.iterations = {it};
  m.data = std::string("\0\1\2", 3);
  m.request = 9;
  m.iteration = 11;
  m.values = {1.0f, -2.0f, 3.5f};
  m.peer = 4;
  m.text = "why";
  return m;
}

Status decodeStatus(const PeerControl& m, const PeerControlLimits& limits = kLimits) {
  return decodePeerControl(encodePeerControl(m), limits).status();
}

TEST(PeerControlTest, EveryKindRoundTrips) {
  for (uint8_t k = 0; k <= static_cast<uint8_t>(PeerControlKind::kHeartbeat); ++k) {
    PeerControl m = fullMessage();
    m.kind = static_cast<PeerControlKind>(k);
    Result<PeerControl> back = decodePeerControl(encodePeerControl(m), kLimits);
    ASSERT_TRUE(back.isOk()) << peerControlKindName(m.kind) << ": " << back.status().toString();
    EXPECT_EQ(*back, m) << peerControlKindName(m.kind);
  }
}

TEST(PeerControlTest, BoundsAreChecked) {
  auto expectRefused = [](const PeerControl& m, const std::string& needle) {
    Status st = decodeStatus(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << needle << ": " << st.toString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.toString();
  };
  PeerControl m = fullMessage();
  m.kind = PeerControlKind::kRegister;
  m.endpoint = "";
  expectRefused(m, "endpoint is empty");
  m.endpoint = std::string(kMaxPeerEndpointBytes + 1, 'x');
  expectRefused(m, "endpoint is");
  m.endpoint = "tcp://\n";
  expectRefused(m, "not printable");

  m = fullMessage();
  m.table.push_back({6, "tcp://127.0.0.1:3", ""});
  expectRefused(m, "names peer 6");
  m = fullMessage();
  m.table.push_back({0, "tcp://127.0.0.1:3", ""});
  expectRefused(m, "twice");
  m = fullMessage();
  m.table[0].public_key = "short";
  expectRefused(m, "not 40");
  m = fullMessage();
  for (uint32_t i = 0; i < 7; ++i) m.table.push_back({i % 6, "tcp://x:1", ""});
  expectRefused(m, "entries for 6 peers");

  m = fullMessage();
  m.iterations[0].t_end = 1.0;  // before t_start
  expectRefused(m, "before its t_start");
  m = fullMessage();
  m.iterations[0].wait_s = -1;
  expectRefused(m, "wait_s");
  m = fullMessage();
  m.iterations[0].compute_s = std::numeric_limits<double>::infinity();
  expectRefused(m, "compute_s");
  m = fullMessage();
  m.iterations.assign(kMaxIterationsPerReport + 1, m.iterations[0]);
  expectRefused(m, "iterations in one report");

  m = fullMessage();
  m.values.assign(101, 0.0f);
  expectRefused(m, "values hold 101");
  m = fullMessage();
  m.values[1] = std::nanf("");
  expectRefused(m, "not finite");

  m = fullMessage();
  m.kind = PeerControlKind::kPeerDown;
  m.peer = 6;
  expectRefused(m, "peer_down names peer 6");
  m = fullMessage();
  m.text.assign(kMaxPeerTextBytes + 1, 'x');
  expectRefused(m, "text is");
}

TEST(PeerControlTest, GarbageIsCorruptOrTooLarge) {
  EXPECT_EQ(decodePeerControl("", kLimits).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(decodePeerControl("1234567", kLimits).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(decodePeerControl(std::string(64, '\xff'), kLimits).status().code(),
            StatusCode::kCorrupt);
  DecodeLimits small;
  small.max_bytes = 16;
  EXPECT_EQ(decodePeerControl(encodePeerControl(fullMessage()), kLimits, small).status().code(),
            StatusCode::kResourceExhausted);
  // An unknown kind.
  PeerControl m = fullMessage();
  m.kind = static_cast<PeerControlKind>(200);
  EXPECT_EQ(decodeStatus(m).code(), StatusCode::kInvalidArgument);
}

TEST(PeerControlTest, PeerKeyNames) {
  EXPECT_EQ(peerKeyName(0), "peer-0");
  EXPECT_EQ(peerKeyName(12), "peer-12");
  EXPECT_EQ(peerIndexOf("peer-0", 6), 0u);
  EXPECT_EQ(peerIndexOf("peer-5", 6), 5u);
  EXPECT_FALSE(peerIndexOf("peer-6", 6).has_value());
  EXPECT_FALSE(peerIndexOf("peer-05", 6).has_value());
  EXPECT_FALSE(peerIndexOf("peer-", 6).has_value());
  EXPECT_FALSE(peerIndexOf("peer-1x", 6).has_value());
  EXPECT_FALSE(peerIndexOf("peer--1", 6).has_value());
  EXPECT_FALSE(peerIndexOf("client-1", 6).has_value());
  EXPECT_FALSE(peerIndexOf("peer-99999999999999999999", 6).has_value());
}

}  // namespace
}  // namespace fedfleet::wire
