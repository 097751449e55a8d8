// SecAgg+ end to end in one process: the unmasked sum equals the plain sum of the survivors'
// integer inputs exactly, with 0, 1 and t - 1 neighbours of a client dropped at each stage, and
// with uploads cut short after some of their chunks were summed (the server keeping the chunks
// of uploads in flight within its memory budget, the rest spilled); too few holders fail the
// round; a masked upload's bytes are indistinguishable from uniform; and each side refuses what
// a hostile peer could send.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/crypto/keyed_stream.h"
#include "common/secagg/secagg_client.h"
#include "common/secagg/secagg_server.h"

namespace fedfleet::secagg {
namespace {

// Who does not take part from which stage on: stage[s] stops before sending stage s's message
// (0: advertise, 1: share keys, 2: masked input, 3: unmask). `partial` sends only the first
// chunk of its masked input.
struct Drops {
  std::array<std::set<uint32_t>, 4> stage;
  std::set<uint32_t> partial;
};

struct Round {
  Result<std::vector<uint32_t>> sum = Status(StatusCode::kInternal, "not run");
  std::vector<uint32_t> survivors;
  std::vector<std::vector<uint32_t>> inputs;
  std::vector<std::vector<uint32_t>> uploads;  // each client's masked input, as sent
};

RoundParams params(uint32_t n, uint64_t length, uint32_t k = 0, uint32_t t = 0) {
  RoundParams p;
  p.round = 7;
  p.clients = n;
  p.neighbours = k ? k : defaultNeighbours(n);
  p.threshold = t ? t : defaultThreshold(std::min(p.neighbours, n - 1));
  p.length = length;
  p.graph_seed = 1234;
  return p;
}

std::vector<uint32_t> inputOf(uint32_t i, uint64_t length) {
  crypto::KeyedStream s(crypto::streamKeyFromSeed("secagg test input", i), 0, 0);
  std::vector<uint32_t> v(length);
  for (auto& x : v) x = static_cast<uint32_t>(s.next64() % (1u << 22));
  return v;
}

Round runRound(const RoundParams& p, const Drops& d) {
  Round r;
  SecAggServer server(p);
  std::vector<std::unique_ptr<SecAggClient>> clients;
  for (uint32_t i = 0; i < p.clients; ++i) {
    clients.push_back(
        std::make_unique<SecAggClient>(p, i, crypto::streamKeyFromSeed("secagg test client", i),
                                       crypto::streamKeyFromSeed("secagg test noise", i)));
    r.inputs.push_back(inputOf(i, p.length));
  }
  r.uploads.resize(p.clients);
  for (uint32_t i = 0; i < p.clients; ++i) {
    if (d.stage[0].count(i)) continue;
    EXPECT_TRUE(server.onAdvert(i, clients[i]->advertise()).isOk());
  }
  for (auto& [i, adverts] : server.closeAdvertise()) {
    if (d.stage[1].count(i)) continue;
    auto sealed = clients[i]->shareKeys(adverts);
    if (!sealed.isOk()) continue;  // too few neighbours: it drops out
    EXPECT_TRUE(server.onSealedShares(i, *sealed).isOk());
  }
  for (auto& [i, sealed] : server.closeShareKeys()) {
    if (d.stage[2].count(i)) continue;
    if (!clients[i]->receiveShares(sealed).isOk()) continue;
    std::vector<uint32_t> y = r.inputs[i];
    const uint64_t cut = p.length / 3 + 1;  // not a multiple of 4: masks resume mid-block
    clients[i]->mask(0, y.data(), cut);
    clients[i]->mask(cut, y.data() + cut, p.length - cut);
    r.uploads[i] = y;
    EXPECT_TRUE(server.onMaskedChunk(i, 0, y.data(), cut).isOk());
    if (d.partial.count(i)) continue;
    EXPECT_TRUE(server.onMaskedChunk(i, cut, y.data() + cut, p.length - cut).isOk());
    EXPECT_TRUE(server.onMaskedDone(i).isOk());
  }
  for (auto& [i, request] : server.closeMaskedInput()) {
    if (d.stage[3].count(i)) continue;
    auto shares = clients[i]->unmask(request);
    EXPECT_TRUE(shares.isOk()) << shares.status().toString();
    if (shares.isOk()) {
      EXPECT_TRUE(server.onRevealed(i, *shares).isOk());
    }
  }
  r.survivors = server.survivors();
  r.sum = server.finish();
  return r;
}

std::vector<uint32_t> plainSum(const Round& r) {
  std::vector<uint32_t> s(r.inputs[0].size(), 0);
  for (uint32_t i : r.survivors) {
    for (size_t v = 0; v < s.size(); ++v) s[v] += r.inputs[i][v];
  }
  return s;
}

struct DropCase {
  uint32_t clients;
  uint32_t neighbours;  // 0: the default
  int stage;            // -1: nobody drops
  int count;            // 0, 1, or -1 for t - 1 neighbours of client 0
};

class SecAggDropouts : public ::testing::TestWithParam<DropCase> {};

TEST_P(SecAggDropouts, UnmaskedSumIsThePlainSumOfTheSurvivors) {
  const DropCase c = GetParam();
  const RoundParams p = params(c.clients, 1001, c.neighbours);
  auto graph = NeighbourGraph::build(p.clients, effectiveDegree(p), p.graph_seed);
  ASSERT_TRUE(graph.isOk());
  const auto& nb = graph->neighbours(0);
  const size_t count = c.count < 0 ? p.threshold - 1 : static_cast<size_t>(c.count);
  Drops d;
  std::set<uint32_t> dropped(nb.begin(), nb.begin() + (c.stage < 0 ? 0 : count));
  if (c.stage >= 0) d.stage[c.stage] = dropped;
  Round r = runRound(p, d);
  ASSERT_TRUE(r.sum.isOk()) << r.sum.status().toString();
  // Client 0 survives; its dropped neighbours are in the sum only if they dropped at unmasking.
  std::set<uint32_t> want;
  for (uint32_t i = 0; i < p.clients; ++i) {
    if (!dropped.count(i) || c.stage == 3) want.insert(i);
  }
  EXPECT_EQ(std::set<uint32_t>(r.survivors.begin(), r.survivors.end()), want);
  EXPECT_EQ(*r.sum, plainSum(r));
}

std::vector<DropCase> dropCases() {
  std::vector<DropCase> out;
  // SecAgg+ (k = 10 of 19, t = 6) and the complete graph (k = 8, t = 5). With k even, k + 1
  // holders less t - 1 leave exactly t.
  for (uint32_t n : {20u, 9u}) {
    const uint32_t k = n == 9 ? 8 : 0;
    out.push_back({n, k, -1, 0});
    for (int stage = 0; stage < 4; ++stage) {
      for (int count : {1, -1}) out.push_back({n, k, stage, count});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stages, SecAggDropouts, ::testing::ValuesIn(dropCases()),
                         [](const auto& info) {
                           const DropCase& c = info.param;
                           return "n" + std::to_string(c.clients) + "_stage" +
                                  (c.stage < 0 ? std::string("none") : std::to_string(c.stage)) +
                                  "_" +
                                  (c.count < 0 ? std::string("tminus1") : std::to_string(c.count));
                         });

TEST(SecAgg, AnIncompleteUploadIsTakenBackOutOfTheSum) {
  const RoundParams p = params(20, 600);
  Drops d;
  d.partial = {3, 11};
  Round r = runRound(p, d);
  ASSERT_TRUE(r.sum.isOk()) << r.sum.status().toString();
  EXPECT_EQ(r.survivors.size(), 18u);
  EXPECT_EQ(*r.sum, plainSum(r));
}

// Twenty uploads arrive interleaved, 100 values a chunk, as from a fleet uploading at once;
// clients 3 and 11 leave after 4 and 9 of their 11 chunks were added to the sum. The unmasked
// sum is still exactly the plain sum of the 18 survivors' inputs, and the server holds no copy
// of each upload in flight: at most the in-memory budget of their chunks (swept: none, three
// chunks of 400 bytes, all of them), the rest in its spill file. (Keeping a copy of every
// upload in flight, as the server once did, would hold 20 x 2.4 KB after 6 chunks each.)
class SecAggInFlight : public ::testing::TestWithParam<uint64_t> {};

TEST_P(SecAggInFlight, UploadsCutShortAreTakenBackAndMemoryStaysWithinTheBudget) {
  const uint64_t budget = GetParam();
  const RoundParams p = params(20, 1001);
  constexpr uint64_t kChunk = 100;
  const std::map<uint32_t, uint64_t> cut = {{3, 4}, {11, 9}};  // chunks sent before leaving
  SecAggServer server(p, budget);
  std::vector<std::unique_ptr<SecAggClient>> clients;
  std::vector<std::vector<uint32_t>> inputs, masked;
  for (uint32_t i = 0; i < p.clients; ++i) {
    clients.push_back(
        std::make_unique<SecAggClient>(p, i, crypto::streamKeyFromSeed("in flight", i),
                                       crypto::streamKeyFromSeed("in flight noise", i)));
    ASSERT_TRUE(server.onAdvert(i, clients[i]->advertise()).isOk());
    inputs.push_back(inputOf(i, p.length));
  }
  for (auto& [i, adverts] : server.closeAdvertise()) {
    ASSERT_TRUE(server.onSealedShares(i, clients[i]->shareKeys(adverts).value()).isOk());
  }
  for (auto& [i, sealed] : server.closeShareKeys()) {
    ASSERT_TRUE(clients[i]->receiveShares(sealed).isOk());
    masked.push_back(inputs[i]);
    clients[i]->mask(0, masked[i].data(), p.length);
  }
  uint64_t received_bytes = 0, most_in_memory = 0;
  for (uint64_t chunk = 0; chunk * kChunk < p.length; ++chunk) {
    for (uint32_t i = 0; i < p.clients; ++i) {
      auto c = cut.find(i);
      if (c != cut.end() && chunk >= c->second) continue;
      const uint64_t offset = chunk * kChunk, n = std::min(kChunk, p.length - offset);
      ASSERT_TRUE(server.onMaskedChunk(i, offset, masked[i].data() + offset, n).isOk());
      received_bytes += 4 * n;
      most_in_memory = std::max(most_in_memory, server.inFlightMemoryBytes());
    }
    if (chunk == 5) {
      EXPECT_EQ(server.inFlightMemoryBytes() + server.inFlightSpilledBytes(), received_bytes);
    }
  }
  EXPECT_LE(most_in_memory, budget);
  EXPECT_EQ(most_in_memory, std::min(budget, received_bytes));  // what fits is kept in memory
  for (uint32_t i = 0; i < p.clients; ++i) {
    if (!cut.count(i)) ASSERT_TRUE(server.onMaskedDone(i).isOk());
  }
  server.markGone(3);
  server.markGone(11);
  EXPECT_TRUE(server.stageComplete());
  for (auto& [i, request] : server.closeMaskedInput()) {
    ASSERT_TRUE(server.onRevealed(i, clients[i]->unmask(request).value()).isOk());
  }
  EXPECT_EQ(server.inFlightMemoryBytes(), 0u);  // nothing of any upload is kept past stage 3
  EXPECT_EQ(server.inFlightSpilledBytes(), 0u);
  auto sum = server.finish();
  ASSERT_TRUE(sum.isOk()) << sum.status().toString();
  ASSERT_EQ(server.survivors().size(), 18u);
  std::vector<uint32_t> plain(p.length, 0);
  for (uint32_t i : server.survivors()) {
    EXPECT_FALSE(cut.count(i));
    for (uint64_t v = 0; v < p.length; ++v) plain[v] += inputs[i][v];
  }
  EXPECT_EQ(*sum, plain);
}

INSTANTIATE_TEST_SUITE_P(Budgets, SecAggInFlight, ::testing::Values(0, 1200, uint64_t{1} << 20),
                         [](const auto& info) { return "bytes" + std::to_string(info.param); });

TEST(SecAgg, RandomDropoutsAtEveryStageStillSumExactly) {
  const RoundParams p = params(60, 257);
  Drops d;
  d.stage[0] = {5, 40};
  d.stage[1] = {17, 33};
  d.stage[2] = {2, 51};
  d.stage[3] = {9, 28};
  d.partial = {44};
  Round r = runRound(p, d);
  ASSERT_TRUE(r.sum.isOk()) << r.sum.status().toString();
  EXPECT_EQ(r.survivors.size(), 53u);  // 60 less the 7 that sent no complete input
  EXPECT_EQ(*r.sum, plainSum(r));
}

TEST(SecAgg, TooFewHoldersAtUnmaskingFailTheRound) {
  const RoundParams p = params(20, 100);
  auto graph = NeighbourGraph::build(20, effectiveDegree(p), p.graph_seed);
  const auto& nb = graph->neighbours(0);
  Drops d;
  // Client 0 and t - 1 of its neighbours drop at unmasking: its seed has k - (t - 1) holders
  // left, fewer than t.
  d.stage[3] = {0};
  d.stage[3].insert(nb.begin(), nb.begin() + (p.threshold - 1));
  Round r = runRound(p, d);
  ASSERT_FALSE(r.sum.isOk());
  EXPECT_EQ(r.sum.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.sum.status().message().find("fewer than the threshold"), std::string::npos)
      << r.sum.status().message();
}

TEST(SecAgg, AClientWithTooFewNeighboursLeftDropsOutAndTheRestSum) {
  const RoundParams p = params(20, 100);
  auto graph = NeighbourGraph::build(20, effectiveDegree(p), p.graph_seed);
  const auto& nb = graph->neighbours(0);
  Drops d;
  d.stage[0].insert(nb.begin(), nb.begin() + p.threshold);  // t of its neighbours never advertise
  Round r = runRound(p, d);
  // Client 0 refused to share (t - 1 holders with itself would be too few) and is not in the
  // sum. Its absence may in turn leave a neighbour of the dropped ones short of holders: then
  // the round fails cleanly, saying whose secret could not be rebuilt; else the sum is exact.
  EXPECT_EQ(std::count(r.survivors.begin(), r.survivors.end(), 0u), 0);
  if (r.sum.isOk()) {
    EXPECT_EQ(*r.sum, plainSum(r));
  } else {
    EXPECT_EQ(r.sum.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.sum.status().message().find("fewer than the threshold"), std::string::npos);
  }
  // The same with every survivor keeping t holders: the complete graph of 8 (t = 5) where 3
  // clients never advertise leaves 5 holders each.
  const RoundParams complete = params(8, 100, 7);
  Drops three;
  three.stage[0] = {1, 2, 3};
  Round c = runRound(complete, three);
  ASSERT_TRUE(c.sum.isOk()) << c.sum.status().toString();
  EXPECT_EQ(c.survivors, (std::vector<uint32_t>{0, 4, 5, 6, 7}));
  EXPECT_EQ(*c.sum, plainSum(c));
  Drops four;
  four.stage[0] = {1, 2, 3, 4};  // 4 holders each: nobody shares, and the round fails
  Round none = runRound(complete, four);
  EXPECT_TRUE(none.survivors.empty());
  EXPECT_EQ(none.sum.status().code(), StatusCode::kFailedPrecondition);
}

// Pearson's chi-square over the 256 byte values of one masked upload of an all-zero input
// (the most structured input there is): 255 degrees of freedom, critical value 330.5 at
// p = 0.001. The unmasked encoding of a real update fails the same test by far.
double chiSquare(const std::vector<uint32_t>& v) {
  std::array<double, 256> counts{};
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  const size_t n = v.size() * 4;
  for (size_t i = 0; i < n; ++i) counts[bytes[i]] += 1;
  const double expected = n / 256.0;
  double chi = 0;
  for (double c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

TEST(SecAgg, AMaskedUploadLooksUniform) {
  const RoundParams p = params(10, 1 << 16);
  SecAggServer server(p);
  std::vector<std::unique_ptr<SecAggClient>> clients;
  for (uint32_t i = 0; i < p.clients; ++i) {
    clients.push_back(std::make_unique<SecAggClient>(p, i, crypto::streamKeyFromSeed("chi", i),
                                                     crypto::streamKeyFromSeed("chi noise", i)));
    ASSERT_TRUE(server.onAdvert(i, clients[i]->advertise()).isOk());
  }
  for (auto& [i, adverts] : server.closeAdvertise()) {
    ASSERT_TRUE(server.onSealedShares(i, clients[i]->shareKeys(adverts).value()).isOk());
  }
  for (auto& [i, sealed] : server.closeShareKeys()) {
    ASSERT_TRUE(clients[i]->receiveShares(sealed).isOk());
  }
  std::vector<uint32_t> zeros(p.length, 0);
  clients[0]->mask(0, zeros.data(), zeros.size());
  EXPECT_LT(chiSquare(zeros), 330.5);
  // Control: quantised values of an update (clustered near the middle of 0 .. 2^22).
  std::vector<uint32_t> plain = inputOf(0, p.length);
  for (auto& x : plain) x = (1u << 21) + (x & 0xff);
  EXPECT_GT(chiSquare(plain), 10000.0);
}

// The private stream (distributed DP's noise) is keyed by the noise key alone: the key the
// shared secrets (self-mask seed, mask key) come from does not change it, the noise key does.
TEST(SecAgg, ThePrivateStreamFollowsTheNoiseKeyNotTheSharedSecrets) {
  const RoundParams p = params(5, 64);
  // (the first 8 bytes of private stream 7, the self-mask seed's digest)
  const auto firstBytes = [&p](const char* secrets_label, const char* noise_label) {
    SecAggClient c(p, 0, crypto::streamKeyFromSeed(secrets_label, 1),
                   crypto::streamKeyFromSeed(noise_label, 1));
    crypto::KeyedStream s = c.privateStream(7);
    return std::make_pair(s.next64(), c.advertise().seed_digest);
  };
  const auto a = firstBytes("a", "x"), b = firstBytes("b", "x"), c = firstBytes("a", "y");
  EXPECT_NE(a.second, b.second);  // other self-mask seeds ...
  EXPECT_EQ(a.first, b.first);    // ... the same noise
  EXPECT_EQ(a.second, c.second);  // the same self-mask seed ...
  EXPECT_NE(a.first, c.first);    // ... other noise
}

class SecAggHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t i = 0; i < p_.clients; ++i) {
      clients_.push_back(
          std::make_unique<SecAggClient>(p_, i, crypto::streamKeyFromSeed("hostile", i),
                                         crypto::streamKeyFromSeed("hostile noise", i)));
    }
  }
  void advertiseAll() {
    for (uint32_t i = 0; i < p_.clients; ++i) {
      ASSERT_TRUE(server_.onAdvert(i, clients_[i]->advertise()).isOk());
    }
    keys_ = server_.closeAdvertise();
  }
  void shareAll() {
    for (auto& [i, adverts] : keys_) {
      ASSERT_TRUE(server_.onSealedShares(i, clients_[i]->shareKeys(adverts).value()).isOk());
    }
    forwarded_ = server_.closeShareKeys();
  }
  void uploadAll() {
    for (auto& [i, sealed] : forwarded_) {
      ASSERT_TRUE(clients_[i]->receiveShares(sealed).isOk());
      std::vector<uint32_t> y(p_.length, i);
      clients_[i]->mask(0, y.data(), y.size());
      ASSERT_TRUE(server_.onMaskedChunk(i, 0, y.data(), y.size()).isOk());
      ASSERT_TRUE(server_.onMaskedDone(i).isOk());
    }
    requests_ = server_.closeMaskedInput();
  }

  RoundParams p_ = params(12, 64);
  SecAggServer server_{p_};
  std::vector<std::unique_ptr<SecAggClient>> clients_;
  std::vector<std::pair<uint32_t, std::vector<KeyAdvert>>> keys_;
  std::vector<std::pair<uint32_t, std::vector<SealedShares>>> forwarded_;
  std::vector<std::pair<uint32_t, UnmaskRequest>> requests_;
};

TEST_F(SecAggHostile, ServerRefusesImpersonationRepeatsAndBadSizes) {
  KeyAdvert a = clients_[1]->advertise();
  EXPECT_EQ(server_.onAdvert(2, a).code(), StatusCode::kInvalidArgument);  // not its index
  KeyAdvert short_key = clients_[2]->advertise();
  short_key.mask_key.pop_back();
  EXPECT_EQ(server_.onAdvert(2, short_key).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(server_.onAdvert(1, a).isOk());
  EXPECT_EQ(server_.onAdvert(1, a).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(server_.onAdvert(99, a).code(), StatusCode::kInvalidArgument);
  std::vector<uint32_t> v(4, 0);
  EXPECT_EQ(server_.onMaskedChunk(1, 0, v.data(), v.size()).code(),
            StatusCode::kFailedPrecondition);  // out of stage
}

TEST_F(SecAggHostile, ServerRefusesSharesThatDoNotCoverTheNeighbours) {
  advertiseAll();
  auto sealed = clients_[0]->shareKeys(keys_[0].second).value();
  auto fewer = sealed;
  fewer.pop_back();
  EXPECT_EQ(server_.onSealedShares(0, fewer).code(), StatusCode::kInvalidArgument);
  auto renamed = sealed;
  renamed[0].from = 5;
  EXPECT_EQ(server_.onSealedShares(0, renamed).code(), StatusCode::kInvalidArgument);
  auto longer = sealed;
  longer[0].sealed += "x";
  EXPECT_EQ(server_.onSealedShares(0, longer).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(server_.onSealedShares(0, sealed).isOk());
  EXPECT_EQ(server_.onSealedShares(0, sealed).code(), StatusCode::kFailedPrecondition);
}

TEST_F(SecAggHostile, ClientRefusesTamperedSharesAndKeysOfStrangers) {
  advertiseAll();
  // A key of a non-neighbour.
  auto adverts = keys_[0].second;
  uint32_t stranger = 0;
  while (stranger == 0 || server_.graph().adjacent(0, stranger)) ++stranger;
  adverts.push_back(clients_[stranger]->advertise());
  EXPECT_EQ(clients_[0]->shareKeys(adverts).status().code(), StatusCode::kInvalidArgument);
  shareAll();
  auto sealed = forwarded_[0].second;
  sealed[0].sealed[20] ^= 1;
  EXPECT_EQ(clients_[0]->receiveShares(sealed).code(), StatusCode::kCorrupt);
}

TEST_F(SecAggHostile, ClientRevealsOnceAndOnlyWhatItHolds) {
  advertiseAll();
  shareAll();
  uploadAll();
  const auto& [i, request] = requests_[0];
  UnmaskRequest self_dropped = request;
  self_dropped.dropped.push_back(i);
  EXPECT_EQ(clients_[i]->unmask(self_dropped).status().code(), StatusCode::kInvalidArgument);
  UnmaskRequest both = request;
  both.dropped.push_back(request.survivors.back());
  EXPECT_EQ(clients_[i]->unmask(both).status().code(), StatusCode::kInvalidArgument);
  auto ok = clients_[i]->unmask(request);
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  // A second request, now claiming a neighbour dropped, could give the key share too: refused.
  UnmaskRequest second;
  second.dropped.push_back(request.survivors.back());
  EXPECT_EQ(clients_[i]->unmask(second).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(SecAggHostile, AFalseShareIsCaughtAtReconstruction) {
  advertiseAll();
  shareAll();
  uploadAll();
  for (size_t r = 0; r < requests_.size(); ++r) {
    auto& [i, request] = requests_[r];
    auto shares = clients_[i]->unmask(request).value();
    if (r == 0) {  // corrupt one seed share it reveals, keeping it a valid field element
      auto s = Share::fromBytes(shares[0].share).value();
      s.y[0] = (s.y[0] + 1) % kFieldPrime;
      shares[0].share = s.toBytes();
    }
    ASSERT_TRUE(server_.onRevealed(i, shares).isOk());
  }
  auto sum = server_.finish();
  EXPECT_EQ(sum.status().code(), StatusCode::kCorrupt);
}

TEST_F(SecAggHostile, ServerRefusesRevealsItDidNotAskFor) {
  advertiseAll();
  shareAll();
  uploadAll();
  auto& [i, request] = requests_[0];
  auto shares = clients_[i]->unmask(request).value();
  auto extra = shares;
  extra.push_back(extra[0]);
  EXPECT_EQ(server_.onRevealed(i, extra).code(), StatusCode::kInvalidArgument);
  auto kind = shares;
  kind[0].self_mask = false;
  EXPECT_EQ(server_.onRevealed(i, kind).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(server_.onRevealed(i, shares).isOk());
  EXPECT_EQ(server_.onRevealed(i, shares).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fedfleet::secagg
