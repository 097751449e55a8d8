#include "common/wire/peer_message.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <string>

#include "common/wire/flat_message.h"
#include "common/wire/peer_message.capnp.h"

namespace fedfleet::wire {
namespace {

constexpr uint8_t kLastKind = static_cast<uint8_t>(PeerMessageKind::kLeave);

Status bad(const std::string& field, uint64_t value, const std::string& bound) {
  return invalidArgument("peer message: " + field + " " + std::to_string(value) + " " + bound);
}

bool carriesValues(PeerMessageKind kind) {
  return kind == PeerMessageKind::kChunk || kind == PeerMessageKind::kModel ||
         kind == PeerMessageKind::kAverageRequest || kind == PeerMessageKind::kAverageReply;
}

}  // namespace

const char* peerMessageKindName(PeerMessageKind kind) {
  switch (kind) {
    case PeerMessageKind::kChunk:
      return "chunk";
    case PeerMessageKind::kModel:
      return "model";
    case PeerMessageKind::kAverageRequest:
      return "average_request";
    case PeerMessageKind::kAverageReply:
      return "average_reply";
    case PeerMessageKind::kGroupRequest:
      return "group_request";
    case PeerMessageKind::kGroupAssign:
      return "group_assign";
    case PeerMessageKind::kLeave:
      return "leave";
  }
  return "unknown";
}

uint64_t PeerMessage::wireBytes() const {
  return 32 + 4 * uint64_t{values.size()} + payload.size() + 4 * uint64_t{members.size()};
}

Status checkPeerMessage(const PeerMessage& m, const PeerMessageLimits& limits) {
  if (static_cast<uint8_t>(m.kind) > kLastKind) {
    return bad("kind", static_cast<uint8_t>(m.kind), "is unknown");
  }
  const std::string peers = std::to_string(limits.peers);
  if (m.from > limits.peers) return bad("from", m.from, "is past the last id " + peers);
  if (m.to > limits.peers) return bad("to", m.to, "is past the last id " + peers);
  if (m.from == m.to) return bad("from", m.from, "is also the receiver");
  const std::string n = std::to_string(limits.model_elements);
  if (m.values.size() > limits.model_elements) {
    return bad("values", m.values.size(), "exceed the model's " + n + " elements");
  }
  if (m.elements > limits.model_elements) {
    return bad("elements", m.elements, "exceed the model's " + n + " elements");
  }
  if (m.payload.size() > 8 * limits.model_elements + 64) {
    return bad("payload of", m.payload.size(),
               "bytes exceeds 8 bytes a model element + 64 (" + n + " elements)");
  }
  if (m.payload.empty() != (m.elements == 0)) {
    return bad("elements", m.elements,
               m.payload.empty() ? "given without a payload" : "is 0 with a payload");
  }
  if (!m.payload.empty() && !m.values.empty()) {
    return bad("values", m.values.size(), "given besides a compressed payload");
  }
  if (!carriesValues(m.kind) && (!m.values.empty() || !m.payload.empty())) {
    return invalidArgument(std::string("peer message: a ") + peerMessageKindName(m.kind) +
                           " carries no values");
  }
  if (m.kind != PeerMessageKind::kChunk && !m.payload.empty()) {
    return invalidArgument(std::string("peer message: a ") + peerMessageKindName(m.kind) +
                           " carries no compressed payload");
  }
  if (m.kind == PeerMessageKind::kChunk) {
    const uint64_t steps = limits.peers >= 1 ? 2 * (uint64_t{limits.peers} - 1) : 0;
    if (m.step >= steps) {
      return bad("step", m.step, "is past the ring's " + std::to_string(steps) + " steps");
    }
    if (m.chunk >= limits.peers) return bad("chunk", m.chunk, "is past the " + peers + " chunks");
  }
  if (m.kind != PeerMessageKind::kGroupAssign) {
    if (!m.members.empty()) {
      return invalidArgument(std::string("peer message: a ") + peerMessageKindName(m.kind) +
                             " carries no members");
    }
    return Status::ok();
  }
  if (m.members.size() > limits.peers) {
    return bad("members", m.members.size(), "are more than the " + peers + " peers");
  }
  for (size_t i = 0; i < m.members.size(); ++i) {
    if (m.members[i] >= limits.peers) return bad("member", m.members[i], "is not a peer");
    if (i > 0 && m.members[i] <= m.members[i - 1]) {
      return bad("member", m.members[i], "is not above the one before (members sorted, distinct)");
    }
  }
  return Status::ok();
}

std::string encodePeerMessage(const PeerMessage& m) {
  capnp::MallocMessageBuilder builder(1024, capnp::AllocationStrategy::GROW_HEURISTICALLY);
  auto b = builder.initRoot<schema::PeerMessage>();
  b.setKind(static_cast<uint8_t>(m.kind));
  b.setFrom(m.from);
  b.setTo(m.to);
  b.setIteration(m.iteration);
  b.setGroup(m.group);
  b.setStep(m.step);
  b.setChunk(m.chunk);
  FEDFLEET_CHECK(m.values.size() <= kMaxFieldBytes / sizeof(float));
  FEDFLEET_CHECK(m.payload.size() <= kMaxFieldBytes);
  auto values = b.initValues(static_cast<unsigned>(m.values.size()));
  for (size_t i = 0; i < m.values.size(); ++i) values.set(static_cast<unsigned>(i), m.values[i]);
  b.setPayload(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(m.payload.data()), m.payload.size()));
  b.setElements(m.elements);
  auto members = b.initMembers(static_cast<unsigned>(m.members.size()));
  for (size_t i = 0; i < m.members.size(); ++i) members.set(static_cast<unsigned>(i), m.members[i]);
  return writeFlat(builder);
}

Result<PeerMessage> decodePeerMessage(std::string_view bytes, const PeerMessageLimits& limits,
                                      const DecodeLimits& decode) {
  return readFlat<schema::PeerMessage, PeerMessage>(
      bytes, decode, "peer message", [&](schema::PeerMessage::Reader r) -> Result<PeerMessage> {
        // Sizes first, against what the receiver knows and the bytes that carry them, before
        // anything is allocated: a list of n floats takes 4n of the message's bytes, and the
        // lists together never take more than the message has (several pointers may name one
        // list).
        uint64_t budget = bytes.size();
        const uint64_t n_values = r.getValues().size();
        const uint64_t n_members = r.getMembers().size();
        if (n_values > limits.model_elements) {
          return bad("values", n_values,
                     "exceed the model's " + std::to_string(limits.model_elements) + " elements");
        }
        if (n_members > limits.peers) {
          return bad("members", n_members,
                     "are more than the " + std::to_string(limits.peers) + " peers");
        }
        if (4 * (n_values + n_members) > budget) {
          return corrupt("peer message: lists of " + std::to_string(n_values + n_members) +
                         " elements more than its " + std::to_string(budget) + " bytes can hold");
        }
        if (r.getKind() > kLastKind) {
          return bad("kind", r.getKind(), "is unknown");
        }
        PeerMessage m;
        m.kind = static_cast<PeerMessageKind>(r.getKind());
        m.from = r.getFrom();
        m.to = r.getTo();
        m.iteration = r.getIteration();
        m.group = r.getGroup();
        m.step = r.getStep();
        m.chunk = r.getChunk();
        m.elements = r.getElements();
        auto payload = r.getPayload();
        if (payload.size() > 8 * limits.model_elements + 64) {
          return bad("payload of", payload.size(),
                     "bytes exceeds 8 bytes a model element + 64 (" +
                         std::to_string(limits.model_elements) + " elements)");
        }
        m.payload.assign(reinterpret_cast<const char*>(payload.begin()), payload.size());
        m.values.resize(n_values);
        auto values = r.getValues();
        for (unsigned i = 0; i < n_values; ++i) m.values[i] = values[i];
        m.members.resize(n_members);
        auto members = r.getMembers();
        for (unsigned i = 0; i < n_members; ++i) m.members[i] = members[i];
        FEDFLEET_RETURN_IF_ERROR(checkPeerMessage(m, limits));
        return m;
      });
}

}  // namespace fedfleet::wire
