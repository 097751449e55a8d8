// The weights a client applies to its update under secure aggregation (client/masked_upload.h):
// n_k / weight_scale capped at 1; under FedNova also divided by a(tau_k, rho) (hand-computed
// values: a(4, 0) = 4, a(3, 0.5) = 3 - 0.5 (1 - 0.125) / 0.5 all over 0.5 = 4.25); under
// central or distributed DP the L2 clip at weight 1 (central: with no noise, and a round's
// unmasked sum is then the sum of the clipped updates). And the secrecy of distributed DP's noise:
// a full SecAgg+ round in which the coordinator rebuilds what unmasking gives it (every survivor's
// self-mask seed b_i, a dropped client's mask key and its pairwise seeds) and still cannot
// regenerate the noise the clients added, so the unmasked sum less anything it can derive is
// not the noise-free sum.
#include "client/masked_upload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/crypto/hkdf.h"
#include "common/crypto/keyed_stream.h"
#include "common/crypto/sha256.h"
#include "common/crypto/x25519.h"
#include "common/privacy/gaussian_noise.h"
#include "common/secagg/quantizer.h"
#include "common/secagg/secagg_client.h"
#include "common/secagg/secagg_server.h"
#include "common/secagg/shamir.h"

namespace fedfleet::client {
namespace {

wire::SecAggTask taskOf(double scale) {
  wire::SecAggTask t;
  t.clients = 2;
  t.weight_scale = scale;
  t.clip_range = 8;
  t.quant_range = 1u << 20;
  return t;
}

TEST(MaskedUpload, FedAvgWeightIsSamplesOverTheScaleAtMostOne) {
  const wire::SecAggTask t = taskOf(40);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 10, 7), 0.25);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 40, 1), 1.0);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 400, 1), 1.0);  // a claim past the scale is capped
}

TEST(MaskedUpload, FedNovaDividesByTheNormaliserOfTheStepsTaken) {
  wire::SecAggTask t = taskOf(40);
  t.fednova = true;
  t.fednova_momentum = 0;
  EXPECT_DOUBLE_EQ(secAggWeight(t, 10, 4), 0.25 / 4);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 1), 0.5);
  t.fednova_momentum = 0.5;
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 3), 0.5 / 4.25);
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 2), 0.5 / 2.5);  // 1 + 1.5
  EXPECT_EQ(secAggWeight(t, 20, 0), 0.0);               // refused by the coordinator anyway
  // Off: the steps do not matter.
  t.fednova = false;
  EXPECT_DOUBLE_EQ(secAggWeight(t, 20, 3), 0.5);
}

TEST(MaskedUpload, DistributedDpClipsAtWeightOne) {
  wire::SecAggTask t = taskOf(1);
  const std::vector<float> delta = {3, 4};                             // norm 5
  EXPECT_DOUBLE_EQ(maskedUploadWeight(t, 0.3, delta.data(), 2), 0.3);  // no DP: as given
  t.dp_clip = 2;
  EXPECT_DOUBLE_EQ(maskedUploadWeight(t, 0.3, delta.data(), 2), 0.4);
  t.dp_clip = 10;
  EXPECT_DOUBLE_EQ(maskedUploadWeight(t, 0.3, delta.data(), 2), 1.0);
}

// Central DP under SecAgg+: the task (as the coordinator makes it for dp.mode = "central")
// carries the clip C = 1 and no noise. Three clients, every pair neighbours, run a round through
// the server: the unmasked sum is the sum of the updates clipped to norm C at weight 1, to
// within the quantisation (3 x 2c/q = 2.3e-5), so the clip was applied before masking and no
// noise was added.
TEST(MaskedUpload, CentralDpClipsBeforeMaskingAndAddsNoNoise) {
  secagg::RoundParams p;
  p.round = 1;
  p.clients = 3;
  p.neighbours = 2;
  p.threshold = 2;
  p.length = 3;
  p.graph_seed = 5;
  wire::SecAggTask task = taskOf(1);
  task.clients = 3;
  task.dp_clip = 1;
  task.dp_noise_stddev = 0;
  const std::vector<std::vector<float>> deltas = {{3, 4, 0}, {0, 0.3f, 0.4f}, {0, 0, -2}};
  const std::vector<double> want = {0.6, 0.8 + 0.3, 0.4 - 1};  // norms 5, 0.5, 2 clipped to 1
  secagg::SecAggServer server(p);
  std::vector<std::unique_ptr<secagg::SecAggClient>> clients;
  for (uint32_t i = 0; i < p.clients; ++i) {
    clients.push_back(
        std::make_unique<secagg::SecAggClient>(p, i, crypto::streamKeyFromSeed("central secagg", i),
                                               crypto::streamKeyFromSeed("central noise", i)));
    ASSERT_TRUE(server.onAdvert(i, clients[i]->advertise()).isOk());
  }
  for (auto& [i, adverts] : server.closeAdvertise()) {
    ASSERT_TRUE(server.onSealedShares(i, clients[i]->shareKeys(adverts).value()).isOk());
  }
  ChunkRange range;
  range.elements = p.length;
  for (auto& [i, sealed] : server.closeShareKeys()) {
    ASSERT_TRUE(clients[i]->receiveShares(sealed).isOk());
    const double w = maskedUploadWeight(task, 0.5, deltas[i].data(), p.length);
    EXPECT_DOUBLE_EQ(w, (std::vector<double>{0.2, 1.0, 0.5})[i]);
    std::string payload;
    ASSERT_TRUE(
        encodeMaskedChunk(*clients[i], task, w, 7 + i, range, deltas[i].data(), &payload).isOk());
    std::vector<uint32_t> y(p.length);
    std::memcpy(y.data(), payload.data(), payload.size());
    ASSERT_TRUE(server.onMaskedChunk(i, 0, y.data(), y.size()).isOk());
    ASSERT_TRUE(server.onMaskedDone(i).isOk());
  }
  for (auto& [i, request] : server.closeMaskedInput()) {
    ASSERT_TRUE(server.onRevealed(i, clients[i]->unmask(request).value()).isOk());
  }
  auto sum = server.finish();
  ASSERT_TRUE(sum.isOk()) << sum.status().toString();
  std::vector<float> decoded(p.length);
  secagg::dequantizeSum({task.clip_range, task.quant_range}, sum->data(), p.length, 3,
                        decoded.data());
  for (uint64_t v = 0; v < p.length; ++v) EXPECT_NEAR(decoded[v], want[v], 3e-5) << v;
}

// A chunk encoded in pieces (more than 65,536 values, the simulator's workers taking some) gives
// the bytes of one pass: weighting, quantising with the chunk's rounding stream from its start,
// then masking at the chunk's offset, written out here. The chunk starts at value 6, inside both
// a rounding block and a mask block, and its 150,003 values make three pieces, run here in
// reverse order on threads of their own.
TEST(MaskedUpload, PiecesGiveTheBytesOfOnePass) {
  secagg::RoundParams p;
  p.round = 3;
  p.clients = 3;
  p.neighbours = 2;
  p.threshold = 2;
  p.length = 150'009;
  p.graph_seed = 11;
  wire::SecAggTask task = taskOf(10);
  task.clients = 3;
  secagg::SecAggServer server(p);
  std::vector<std::unique_ptr<secagg::SecAggClient>> clients;
  for (uint32_t i = 0; i < p.clients; ++i) {
    clients.push_back(
        std::make_unique<secagg::SecAggClient>(p, i, crypto::streamKeyFromSeed("pieces secagg", i),
                                               crypto::streamKeyFromSeed("pieces noise", i)));
    ASSERT_TRUE(server.onAdvert(i, clients[i]->advertise()).isOk());
  }
  for (auto& [i, adverts] : server.closeAdvertise()) {
    ASSERT_TRUE(server.onSealedShares(i, clients[i]->shareKeys(adverts).value()).isOk());
  }
  for (auto& [i, sealed] : server.closeShareKeys()) {
    ASSERT_TRUE(clients[i]->receiveShares(sealed).isOk());
  }
  ChunkRange range;
  range.offset = 6;
  range.elements = 150'003;
  std::vector<float> x(range.elements);
  crypto::KeyedStream values(crypto::streamKeyFromSeed("pieces input", 0), 0, 0);
  for (float& v : x) v = static_cast<float>(24 * values.nextOpenUnit() - 12);  // some clipped
  const double weight = 0.7;
  const uint64_t seed = 42;

  std::vector<float> weighted(x.size());
  for (size_t i = 0; i < x.size(); ++i) weighted[i] = static_cast<float>(weight * x[i]);
  std::vector<uint32_t> want(x.size());
  crypto::KeyedStream rounding(crypto::streamKeyFromSeed("fedfleet secagg rounding", seed), 0,
                               range.offset);
  secagg::quantize({task.clip_range, task.quant_range}, weighted.data(), weighted.size(), rounding,
                   want.data());
  clients[1]->mask(range.offset, want.data(), want.size());

  std::vector<size_t> order;
  const RunPieces reversed = [&](size_t pieces, const std::function<void(size_t)>& piece) {
    std::vector<std::thread> threads;
    for (size_t k = pieces; k-- > 0;) {
      order.push_back(k);
      threads.emplace_back([&piece, k] { piece(k); });
    }
    for (auto& t : threads) t.join();
  };
  std::string one_pass, in_pieces;
  ASSERT_TRUE(
      encodeMaskedChunk(*clients[1], task, weight, seed, range, x.data(), &one_pass).isOk());
  ASSERT_TRUE(
      encodeMaskedChunk(*clients[1], task, weight, seed, range, x.data(), &in_pieces, reversed)
          .isOk());
  EXPECT_EQ(order, (std::vector<size_t>{2, 1, 0}));
  ASSERT_EQ(one_pass.size(), want.size() * sizeof(uint32_t));
  EXPECT_EQ(in_pieces, one_pass);
  std::vector<uint32_t> got(want.size());
  std::memcpy(got.data(), in_pieces.data(), in_pieces.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
}

// Distributed DP under SecAgg+: 5 clients, every pair neighbours (k = 4, t = 3); client 4 shares
// its keys and then drops, so unmasking rebuilds its mask key as well as the survivors' seeds.
class DistributedDpSecrecy : public ::testing::Test {
 protected:
  static constexpr uint32_t kClients = 5;
  static constexpr uint32_t kDropped = 4;
  static constexpr uint64_t kLength = 4000;
  static constexpr double kSigma = 0.5;  // each client's noise standard deviation

  void SetUp() override {
    p_.round = 3;
    p_.clients = kClients;
    p_.neighbours = kClients - 1;
    p_.threshold = 3;
    p_.length = kLength;
    p_.graph_seed = 99;
    task_.clients = kClients;
    task_.weight_scale = 1;
    task_.clip_range = 8;
    task_.quant_range = 1u << 20;
    task_.dp_clip = 1;
    task_.dp_noise_stddev = kSigma;
    range_.elements = kLength;

    secagg::SecAggServer server(p_);
    for (uint32_t i = 0; i < kClients; ++i) {
      clients_.push_back(std::make_unique<secagg::SecAggClient>(
          p_, i, crypto::streamKeyFromSeed("dp secrecy secagg", i),
          crypto::streamKeyFromSeed("dp secrecy noise", i)));
      adverts_.push_back(clients_[i]->advertise());
      ASSERT_TRUE(server.onAdvert(i, adverts_[i]).isOk());
      crypto::KeyedStream s(crypto::streamKeyFromSeed("dp secrecy input", i), 0, 0);
      std::vector<float> x(kLength);
      for (float& v : x) v = static_cast<float>(2 * s.nextOpenUnit() - 1);
      inputs_.push_back(std::move(x));
    }
    for (auto& [i, adverts] : server.closeAdvertise()) {
      auto sealed = clients_[i]->shareKeys(adverts);
      ASSERT_TRUE(sealed.isOk()) << sealed.status().toString();
      ASSERT_TRUE(server.onSealedShares(i, *sealed).isOk());
    }
    for (auto& [i, sealed] : server.closeShareKeys()) {
      ASSERT_TRUE(clients_[i]->receiveShares(sealed).isOk());
      if (i == kDropped) continue;
      std::vector<uint32_t> y = encode(i, task_);
      ASSERT_TRUE(server.onMaskedChunk(i, 0, y.data(), y.size()).isOk());
      ASSERT_TRUE(server.onMaskedDone(i).isOk());
    }
    for (auto& [i, request] : server.closeMaskedInput()) {
      auto revealed = clients_[i]->unmask(request);
      ASSERT_TRUE(revealed.isOk()) << revealed.status().toString();
      for (const secagg::RevealedShare& r : *revealed) {
        auto share = secagg::Share::fromBytes(r.share);
        ASSERT_TRUE(share.isOk());
        (r.self_mask ? seed_shares_ : key_shares_)[r.owner].push_back(*share);
      }
      ASSERT_TRUE(server.onRevealed(i, *revealed).isOk());
    }
    survivors_ = server.survivors();
    ASSERT_EQ(survivors_, (std::vector<uint32_t>{0, 1, 2, 3}));
    auto sum = server.finish();
    ASSERT_TRUE(sum.isOk()) << sum.status().toString();
    sum_ = std::move(sum).value();
  }

  // Client i's masked upload of its input under `task`, as it sends it.
  std::vector<uint32_t> encode(uint32_t i, const wire::SecAggTask& task) const {
    std::string payload;
    EXPECT_TRUE(
        encodeMaskedChunk(*clients_[i], task, 1.0, 1000 + i, range_, inputs_[i].data(), &payload)
            .isOk());
    std::vector<uint32_t> y(kLength);
    std::memcpy(y.data(), payload.data(), payload.size());
    return y;
  }

  // The noise client i actually added: its upload less the same upload without noise (the
  // masks and the rounding draws are the same, so they cancel), in value units.
  std::vector<double> noiseAdded(uint32_t i) const {
    wire::SecAggTask quiet = task_;
    quiet.dp_noise_stddev = 0;
    const std::vector<uint32_t> noisy = encode(i, task_), plain = encode(i, quiet);
    const double step = 2 * task_.clip_range / task_.quant_range;
    std::vector<double> n(kLength);
    for (uint64_t v = 0; v < kLength; ++v) {
      n[v] = static_cast<int32_t>(noisy[v] - plain[v]) * step;
    }
    return n;
  }

  // What unmasking gave the coordinator: each survivor's self-mask seed and the dropped client's
  // pairwise mask seed with each survivor, each checked against what its owner advertised.
  std::vector<std::string> rebuiltSecrets() const {
    std::vector<std::string> out;
    for (uint32_t i : survivors_) {
      auto b = secagg::combineShares(seed_shares_.at(i), 32);
      EXPECT_TRUE(b.isOk());
      const crypto::Digest d = crypto::sha256(*b);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.data()), d.size()),
                adverts_[i].seed_digest);
      out.push_back(*b);
    }
    auto key = secagg::combineShares(key_shares_.at(kDropped), 32);
    EXPECT_TRUE(key.isOk());
    EXPECT_EQ(crypto::x25519PublicKey(*key), adverts_[kDropped].mask_key);
    out.push_back(*key);
    for (uint32_t i : survivors_) {
      auto secret = crypto::x25519Agree(*key, adverts_[i].mask_key);
      EXPECT_TRUE(secret.isOk());
      out.push_back(secagg::pairwiseMaskSeed(*secret, p_.round, i, kDropped));
    }
    return out;
  }

  // Noise of standard deviation kSigma regenerated from `secret`: as the stream was derived from
  // the self-mask seed before (HKDF), and with the secret itself as the stream's key.
  static std::vector<std::vector<double>> noiseFrom(const std::string& secret) {
    std::vector<std::vector<double>> out;
    for (const std::string& key :
         {crypto::hkdfSha256(secret, "fedfleet secagg v1 private stream", "", 32), secret}) {
      privacy::GaussianStream g(crypto::KeyedStream(key, 0x707269763176, 0));
      std::vector<double> n(kLength);
      for (double& v : n) v = kSigma * g.next();
      out.push_back(std::move(n));
    }
    return out;
  }

  static double rms(const std::vector<double>& a, const std::vector<double>& b) {
    double sq = 0;
    for (size_t v = 0; v < a.size(); ++v) sq += (a[v] - b[v]) * (a[v] - b[v]);
    return std::sqrt(sq / a.size());
  }

  secagg::RoundParams p_;
  wire::SecAggTask task_;
  ChunkRange range_;
  std::vector<std::unique_ptr<secagg::SecAggClient>> clients_;
  std::vector<secagg::KeyAdvert> adverts_;
  std::vector<std::vector<float>> inputs_;
  std::map<uint32_t, std::vector<secagg::Share>> seed_shares_, key_shares_;  // by owner
  std::vector<uint32_t> survivors_;
  std::vector<uint32_t> sum_;
};

TEST_F(DistributedDpSecrecy, NothingTheCoordinatorRebuildsRegeneratesAClientsNoise) {
  const std::vector<double> zero(kLength, 0.0);
  const std::vector<std::string> secrets = rebuiltSecrets();
  for (uint32_t i : survivors_) {
    const std::vector<double> added = noiseAdded(i);
    // The noise is there, at the scale the task asks for.
    EXPECT_NEAR(rms(added, zero), kSigma, 0.05 * kSigma) << "client " << i;
    // A regenerated stream independent of it misses by sqrt(2) sigma; the same stream would miss
    // by the quantisation step alone (2c/q, about 1.5e-5).
    for (const std::string& secret : secrets) {
      for (const std::vector<double>& guess : noiseFrom(secret)) {
        EXPECT_GT(rms(added, guess), kSigma) << "client " << i << "'s noise follows from a secret "
                                             << "the coordinator rebuilt";
      }
    }
  }
}

TEST_F(DistributedDpSecrecy, TheSumLessWhatTheCoordinatorCanDeriveIsNotTheNoiseFreeSum) {
  std::vector<float> decoded(kLength);
  secagg::dequantizeSum({task_.clip_range, task_.quant_range}, sum_.data(), kLength,
                        survivors_.size(), decoded.data());
  std::vector<double> noise_in_sum(kLength), plain(kLength, 0.0);
  for (uint64_t v = 0; v < kLength; ++v) {
    for (uint32_t i : survivors_) plain[v] += inputs_[i][v];
    noise_in_sum[v] = decoded[v] - plain[v];
  }
  const std::vector<double> zero(kLength, 0.0);
  const double sum_sigma = kSigma * std::sqrt(static_cast<double>(survivors_.size()));
  EXPECT_NEAR(rms(noise_in_sum, zero), sum_sigma, 0.05 * sum_sigma);
  // The coordinator's best use of the survivors' rebuilt seeds: take out the noise they would
  // have drawn. What remains is as far from the noise-free sum as before, plus that guess.
  const std::vector<std::string> secrets = rebuiltSecrets();
  std::vector<double> guess(kLength, 0.0);
  for (size_t s = 0; s < survivors_.size(); ++s) {
    const std::vector<double> n = noiseFrom(secrets[s])[0];
    for (uint64_t v = 0; v < kLength; ++v) guess[v] += n[v];
  }
  EXPECT_GT(rms(noise_in_sum, guess), sum_sigma);
}

}  // namespace
}  // namespace fedfleet::client
