#include "common/wire/peer_message.h"

#include <gtest/gtest.h>

namespace fedfleet::wire {
namespace {

const PeerMessageLimits kLimits{/*peers=*/8, /*model_elements=*/100};

PeerMessage chunk() {
  PeerMessage m;
  m.kind = PeerMessageKind::kChunk;
  m.from = 3;
  m.to = 4;
  m.iteration = 12345678901ull;
  m.group = 7;
  m.step = 13;
  m.chunk = 5;
  m.values = {1.5f, -2.25f, 0.0f};
  return m;
}

TEST(PeerMessageTest, RoundTripsEveryKind) {
  std::vector<PeerMessage> all;
  all.push_back(chunk());
  PeerMessage compressed = chunk();
  compressed.values.clear();
  compressed.payload = std::string("\x01\x02\x03\x00\xff", 5);
  compressed.elements = 40;
  all.push_back(compressed);
  PeerMessage model;
  model.kind = PeerMessageKind::kModel;
  model.from = 0;
  model.to = 7;
  model.values.assign(100, 0.5f);
  all.push_back(model);
  for (auto kind : {PeerMessageKind::kAverageRequest, PeerMessageKind::kAverageReply}) {
    model.kind = kind;
    all.push_back(model);
  }
  PeerMessage request;
  request.kind = PeerMessageKind::kGroupRequest;
  request.from = 2;
  request.to = 8;  // the generator
  request.iteration = 9;
  all.push_back(request);
  PeerMessage assign;
  assign.kind = PeerMessageKind::kGroupAssign;
  assign.from = 8;
  assign.to = 2;
  assign.group = 44;
  assign.members = {0, 2, 5, 7};
  all.push_back(assign);
  request.kind = PeerMessageKind::kLeave;
  all.push_back(request);
  for (const PeerMessage& m : all) {
    std::string bytes = encodePeerMessage(m);
    auto back = decodePeerMessage(bytes, kLimits);
    ASSERT_TRUE(back.isOk()) << peerMessageKindName(m.kind) << ": " << back.status().message();
    EXPECT_EQ(back.value(), m) << peerMessageKindName(m.kind);
  }
  EXPECT_EQ(chunk().wireBytes(), 32u + 12u);
}

// The bound a message breaks shows in its refusal.
void expectRefused(const PeerMessage& m, const std::string& what) {
  auto r = decodePeerMessage(encodePeerMessage(m), kLimits);
  ASSERT_FALSE(r.isOk()) << what;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  EXPECT_EQ(checkPeerMessage(m, kLimits).code(), StatusCode::kInvalidArgument);
}

TEST(PeerMessageTest, RefusesWhatBreaksTheReceiversBounds) {
  PeerMessage m = chunk();
  m.from = 9;
  expectRefused(m, "from 9");
  m = chunk();
  m.to = 3;
  expectRefused(m, "also the receiver");
  m = chunk();
  m.values.assign(101, 1.0f);
  expectRefused(m, "values 101 exceed the model's 100");
  m = chunk();
  m.step = 14;  // 2 (8 - 1) steps: 0 .. 13
  expectRefused(m, "step 14");
  m = chunk();
  m.chunk = 8;
  expectRefused(m, "chunk 8");
  m = chunk();
  m.values.clear();
  m.payload = "xx";
  expectRefused(m, "is 0 with a payload");
  m.elements = 101;
  expectRefused(m, "elements 101");
  m.elements = 2;
  m.payload.assign(8 * 100 + 65, 'x');
  expectRefused(m, "payload of 865 bytes");
  m = chunk();
  m.payload = "xx";
  m.elements = 3;
  expectRefused(m, "besides a compressed payload");
  PeerMessage r;
  r.kind = PeerMessageKind::kGroupRequest;
  r.from = 1;
  r.to = 8;
  r.values = {1.0f};
  expectRefused(r, "carries no values");
  r.values.clear();
  r.members = {1};
  expectRefused(r, "carries no members");
  PeerMessage a;
  a.kind = PeerMessageKind::kGroupAssign;
  a.from = 8;
  a.to = 1;
  a.members = {1, 1};
  expectRefused(a, "sorted, distinct");
  a.members = {1, 8};
  expectRefused(a, "member 8 is not a peer");
  a.members = {0, 1, 2, 3, 4, 5, 6, 7, 7};
  expectRefused(a, "members 9 are more than the 8 peers");
}

TEST(PeerMessageTest, RefusesBytesThatAreNotAMessage) {
  std::string bytes = encodePeerMessage(chunk());
  EXPECT_EQ(decodePeerMessage(bytes.substr(0, bytes.size() - 8), kLimits).status().code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(decodePeerMessage("", kLimits).status().code(), StatusCode::kCorrupt);
  DecodeLimits small;
  small.max_bytes = 16;
  EXPECT_EQ(decodePeerMessage(bytes, kLimits, small).status().code(),
            StatusCode::kResourceExhausted);
  // An unknown kind.
  PeerMessage m = chunk();
  m.kind = static_cast<PeerMessageKind>(9);
  EXPECT_EQ(decodePeerMessage(encodePeerMessage(m), kLimits).status().code(),
            StatusCode::kInvalidArgument);
  // Every truncation and every single-byte corruption decodes to an error or a checked
  // message, never a crash.
  for (size_t cut = 0; cut < bytes.size(); cut += 8) {
    (void)decodePeerMessage(bytes.substr(0, cut), kLimits);
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x5a);
    auto r = decodePeerMessage(b, kLimits);
    if (r.isOk()) {
      EXPECT_TRUE(checkPeerMessage(r.value(), kLimits).isOk());
    }
  }
}

TEST(PeerMessageTest, AListCannotClaimMoreThanItsBytes) {
  // A model message whose values list pointer claims 100 elements in a message holding fewer
  // bytes: hand-built by shrinking a valid encoding's list and keeping its claimed count.
  PeerMessage m;
  m.kind = PeerMessageKind::kModel;
  m.from = 1;
  m.to = 2;
  m.values.assign(100, 1.0f);
  std::string bytes = encodePeerMessage(m);
  // Cut the list's data (the last 400 bytes) but keep the segment table's word count honest:
  // Cap'n Proto refuses the out-of-bounds list (kCorrupt) or the budget does; never a read
  // past the bytes.
  std::string cut = bytes.substr(0, bytes.size() - 400);
  auto r = decodePeerMessage(cut, kLimits);
  EXPECT_FALSE(r.isOk());
}

}  // namespace
}  // namespace fedfleet::wire
