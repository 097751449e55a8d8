#include "common/wire/peer_control.h"

#include <charconv>
#include <cmath>
#include <set>

#include "common/wire/flat_message.h"
#include "common/wire/peer_control.capnp.h"

namespace fedfleet::wire {
namespace {

constexpr uint8_t kLastKind = static_cast<uint8_t>(PeerControlKind::kHeartbeat);

capnp::Data::Reader asData(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

Status bad(const std::string& what) { return invalidArgument("peer control: " + what); }

bool printable(std::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

bool nonNegative(double v) { return std::isfinite(v) && v >= 0; }

Status checkIteration(const PeerIteration& it, size_t i) {
  const std::string where = "iterations[" + std::to_string(i) + "]";
  for (auto [name, v] : {std::pair<const char*, double>{"t_start", it.t_start},
                         {"t_end", it.t_end},
                         {"compute_s", it.compute_s},
                         {"comm_s", it.comm_s},
                         {"wait_s", it.wait_s}}) {
    if (!nonNegative(v)) return bad(where + "." + name + " is negative or not finite");
  }
  if (it.t_end < it.t_start) return bad(where + ".t_end is before its t_start");
  return Status::ok();
}

Result<PeerControl> readControl(schema::PeerControl::Reader r, const PeerControlLimits& limits) {
  PeerControl m;
  if (r.getKind() > kLastKind) return bad("unknown kind " + std::to_string(r.getKind()));
  m.kind = static_cast<PeerControlKind>(r.getKind());

  const auto endpoint = r.getEndpoint();
  if (endpoint.size() > kMaxPeerEndpointBytes) {
    return bad("endpoint is " + std::to_string(endpoint.size()) + " bytes, limit " +
               std::to_string(kMaxPeerEndpointBytes));
  }
  m.endpoint.assign(endpoint.cStr(), endpoint.size());
  if (!printable(m.endpoint)) return bad("endpoint is not printable ASCII");
  if (m.kind == PeerControlKind::kRegister && m.endpoint.empty()) return bad("endpoint is empty");

  const auto table = r.getTable();
  if (table.size() > limits.peers) {
    return bad("table has " + std::to_string(table.size()) + " entries for " +
               std::to_string(limits.peers) + " peers");
  }
  std::set<uint32_t> seen;
  for (auto e : table) {
    PeerTableEntry entry;
    entry.peer = e.getPeer();
    if (entry.peer >= limits.peers) {
      return bad("table names peer " + std::to_string(entry.peer) + " of " +
                 std::to_string(limits.peers));
    }
    if (!seen.insert(entry.peer).second) {
      return bad("table lists peer " + std::to_string(entry.peer) + " twice");
    }
    if (e.getEndpoint().size() > kMaxPeerEndpointBytes || e.getEndpoint().size() == 0) {
      return bad("table endpoint of peer " + std::to_string(entry.peer) + " is empty or too long");
    }
    entry.endpoint.assign(e.getEndpoint().cStr(), e.getEndpoint().size());
    if (!printable(entry.endpoint)) return bad("table endpoint is not printable ASCII");
    const auto key = e.getPublicKey();
    if (key.size() != 0 && key.size() != 40) {
      return bad("table public key of peer " + std::to_string(entry.peer) + " is " +
                 std::to_string(key.size()) + " characters, not 40");
    }
    entry.public_key.assign(key.cStr(), key.size());
    if (!printable(entry.public_key)) return bad("table public key is not printable");
    m.table.push_back(std::move(entry));
  }

  const auto iterations = r.getIterations();
  if (iterations.size() > kMaxIterationsPerReport) {
    return bad(std::to_string(iterations.size()) + " iterations in one report, limit " +
               std::to_string(kMaxIterationsPerReport));
  }
  for (auto i : iterations) {
    PeerIteration it;
    it.iteration = i.getIteration();
    it.t_start = i.getTStart();
    it.t_end = i.getTEnd();
    it.compute_s = i.getComputeS();
    it.comm_s = i.getCommS();
    it.wait_s = i.getWaitS();
    it.bytes_sent = i.getBytesSent();
    it.bytes_received = i.getBytesReceived();
    it.exchanges = i.getExchanges();
    it.staleness = i.getStaleness();
    it.skipped = i.getSkipped();
    it.loss = i.getLoss();
    FEDFLEET_RETURN_IF_ERROR(checkIteration(it, m.iterations.size()));
    m.iterations.push_back(it);
  }

  const auto data = r.getData();
  m.data.assign(reinterpret_cast<const char*>(data.begin()), data.size());
  m.request = r.getRequest();
  m.iteration = r.getIteration();

  const auto values = r.getValues();
  if (values.size() > limits.model_elements) {
    return bad("values hold " + std::to_string(values.size()) + " elements, the model " +
               std::to_string(limits.model_elements));
  }
  m.values.resize(values.size());
  for (unsigned i = 0; i < values.size(); ++i) {
    m.values[i] = values[i];
    if (!std::isfinite(m.values[i])) return bad("values[" + std::to_string(i) + "] is not finite");
  }

  m.peer = r.getPeer();
  if (m.kind == PeerControlKind::kPeerDown && m.peer >= limits.peers) {
    return bad("peer_down names peer " + std::to_string(m.peer) + " of " +
               std::to_string(limits.peers));
  }
  const auto text = r.getText();
  if (text.size() > kMaxPeerTextBytes) {
    return bad("text is " + std::to_string(text.size()) + " bytes, limit " +
               std::to_string(kMaxPeerTextBytes));
  }
  m.text.assign(text.cStr(), text.size());
  return m;
}

}  // namespace

const char* peerControlKindName(PeerControlKind kind) {
  switch (kind) {
    case PeerControlKind::kRegister:
      return "register";
    case PeerControlKind::kTable:
      return "table";
    case PeerControlKind::kIterations:
      return "iterations";
    case PeerControlKind::kEngine:
      return "engine";
    case PeerControlKind::kModelRequest:
      return "model_request";
    case PeerControlKind::kModelReply:
      return "model_reply";
    case PeerControlKind::kFinished:
      return "finished";
    case PeerControlKind::kFailed:
      return "failed";
    case PeerControlKind::kPeerDown:
      return "peer_down";
    case PeerControlKind::kStop:
      return "stop";
    case PeerControlKind::kHeartbeat:
      return "heartbeat";
  }
  return "unknown";
}

std::string encodePeerControl(const PeerControl& m) {
  capnp::MallocMessageBuilder builder;
  auto b = builder.initRoot<schema::PeerControl>();
  b.setKind(static_cast<uint8_t>(m.kind));
  b.setEndpoint(m.endpoint);
  auto table = b.initTable(static_cast<unsigned>(m.table.size()));
  for (size_t i = 0; i < m.table.size(); ++i) {
    auto e = table[static_cast<unsigned>(i)];
    e.setPeer(m.table[i].peer);
    e.setEndpoint(m.table[i].endpoint);
    e.setPublicKey(m.table[i].public_key);
  }
  auto iterations = b.initIterations(static_cast<unsigned>(m.iterations.size()));
  for (size_t i = 0; i < m.iterations.size(); ++i) {
    const PeerIteration& it = m.iterations[i];
    auto e = iterations[static_cast<unsigned>(i)];
    e.setIteration(it.iteration);
    e.setTStart(it.t_start);
    e.setTEnd(it.t_end);
    e.setComputeS(it.compute_s);
    e.setCommS(it.comm_s);
    e.setWaitS(it.wait_s);
    e.setBytesSent(it.bytes_sent);
    e.setBytesReceived(it.bytes_received);
    e.setExchanges(it.exchanges);
    e.setStaleness(it.staleness);
    e.setSkipped(it.skipped);
    e.setLoss(it.loss);
  }
  FEDFLEET_CHECK(m.data.size() <= kMaxFieldBytes);
  b.setData(asData(m.data));
  b.setRequest(m.request);
  b.setIteration(m.iteration);
  FEDFLEET_CHECK(m.values.size() <= kMaxFieldBytes);
  auto values = b.initValues(static_cast<unsigned>(m.values.size()));
  for (size_t i = 0; i < m.values.size(); ++i) values.set(static_cast<unsigned>(i), m.values[i]);
  b.setPeer(m.peer);
  b.setText(m.text);
  return writeFlat(builder);
}

Result<PeerControl> decodePeerControl(std::string_view bytes, const PeerControlLimits& limits,
                                      const DecodeLimits& decode) {
  return readFlat<schema::PeerControl, PeerControl>(
      bytes, decode, "peer control message",
      [&](schema::PeerControl::Reader r) { return readControl(r, limits); });
}

std::string peerKeyName(uint32_t index) { return "peer-" + std::to_string(index); }

std::optional<uint32_t> peerIndexOf(std::string_view id, uint32_t peers) {
  constexpr std::string_view kPrefix = "peer-";
  if (id.size() <= kPrefix.size() || id.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view digits = id.substr(kPrefix.size());
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  uint32_t index = 0;
  auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (err != std::errc() || end != digits.data() + digits.size() || index >= peers) {
    return std::nullopt;
  }
  return index;
}

}  // namespace fedfleet::wire
