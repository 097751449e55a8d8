// What SecAgg+ costs one client, measured: its cryptographic work (advertising keys, sharing
// them with its neighbours, opening theirs, quantising and masking its update, revealing
// shares) and the bytes of its secure-aggregation messages and masked upload, for a round of
// --clients clients with the default degree and threshold, on a model of --params values.
// Also the per-operation costs the simulator's virtual clock uses (sim/secagg_cost.h), measured
// here. Prints one line "CLIENT clients=N k=K t=T compute_s=S bytes=B" per size and one
// "OPS ..." line.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/crypto/hkdf.h"
#include "common/crypto/keyed_stream.h"
#include "common/crypto/x25519.h"
#include "common/secagg/quantizer.h"
#include "common/secagg/secagg_client.h"
#include "common/secagg/secagg_server.h"
#include "common/wire/messages.h"

using namespace fedfleet;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t bytesOf(const wire::SecAgg& m) { return wire::encode(wire::Message(m)).size(); }

// Runs the key stages of a round of `n` for every client (they are needed for one client's
// forwarded shares), then times client 0's own work through the whole protocol.
void clientCost(uint32_t n, uint64_t params, int reps) {
  secagg::RoundParams p;
  p.round = 1;
  p.clients = n;
  p.neighbours = secagg::defaultNeighbours(n);
  p.threshold = secagg::defaultThreshold(secagg::effectiveDegree(p));
  p.length = params;
  p.graph_seed = 7;
  double best = 1e30;
  size_t bytes = 0;
  for (int rep = 0; rep < reps; ++rep) {
    secagg::SecAggServer server(p);
    std::vector<std::unique_ptr<secagg::SecAggClient>> clients;
    double own = 0, t0 = 0;
    bytes = 0;
    for (uint32_t i = 0; i < n; ++i) {
      t0 = now();
      clients.push_back(
          std::make_unique<secagg::SecAggClient>(p, i, crypto::streamKeyFromSeed("bench", i),
                                                 crypto::streamKeyFromSeed("bench noise", i)));
      wire::SecAgg advert{1, wire::SecAggStep::kAdvert, {clients[i]->advertise()}, {}, {}, {}};
      if (i == 0) {
        own += now() - t0;
        bytes += bytesOf(advert);
      }
      if (!server.onAdvert(i, advert.adverts[0]).isOk()) std::abort();
    }
    for (auto& [i, adverts] : server.closeAdvertise()) {
      if (i == 0) bytes += bytesOf({1, wire::SecAggStep::kKeys, adverts, {}, {}, {}});
      t0 = now();
      auto shares = clients[i]->shareKeys(adverts);
      if (i == 0) own += now() - t0;
      if (!shares.isOk() || !server.onSealedShares(i, *shares).isOk()) std::abort();
      if (i == 0) bytes += bytesOf({1, wire::SecAggStep::kShares, {}, *shares, {}, {}});
    }
    std::vector<float> update(params, 0.001f);
    std::vector<uint32_t> masked(params);
    for (auto& [i, sealed] : server.closeShareKeys()) {
      if (i != 0) continue;
      bytes += bytesOf({1, wire::SecAggStep::kForwarded, {}, sealed, {}, {}});
      t0 = now();
      if (!clients[0]->receiveShares(sealed).isOk()) std::abort();
      crypto::KeyedStream rounding(crypto::streamKeyFromSeed("rounding", 0), 0, 0);
      secagg::quantize({8.0, 1u << 22}, update.data(), params, rounding, masked.data());
      clients[0]->mask(0, masked.data(), params);
      own += now() - t0;
      bytes += params * sizeof(uint32_t);
    }
    secagg::UnmaskRequest request;
    request.survivors.push_back(0);
    for (uint32_t j : clients[0]->maskPartners()) request.survivors.push_back(j);
    bytes += bytesOf({1, wire::SecAggStep::kUnmask, {}, {}, request, {}});
    t0 = now();
    auto revealed = clients[0]->unmask(request);
    own += now() - t0;
    if (!revealed.isOk()) std::abort();
    bytes += bytesOf({1, wire::SecAggStep::kReveal, {}, {}, {}, *revealed});
    best = std::min(best, own);
  }
  std::printf("CLIENT clients=%u k=%u t=%u compute_s=%.6f bytes=%zu\n", n,
              secagg::effectiveDegree(p), p.threshold, best, bytes);
}

template <class F>
double perCall(int n, F f) {
  const double t0 = now();
  for (int i = 0; i < n; ++i) f(i);
  return (now() - t0) / n;
}

void opCosts() {
  std::string sk(32, 'a');
  const std::string peer = crypto::x25519PublicKey(std::string(32, 'b'));
  size_t sink = 0;
  const double keygen = perCall(2000, [&](int i) {
    sk[0] = static_cast<char>(i);
    sink += crypto::x25519PublicKey(sk).size();
  });
  const double agree = perCall(2000, [&](int i) {
    sk[0] = static_cast<char>(i);
    sink += crypto::x25519Agree(sk, peer)->size();
  });
  const double hkdf =
      perCall(20000, [&](int) { sink += crypto::hkdfSha256(sk, "s", "i", 32).size(); });
  std::vector<uint32_t> v(1 << 20);
  const double mask =
      perCall(10, [&](int) { secagg::addMask(sk, true, 1, 0, v.data(), v.size()); }) / v.size();
  std::vector<float> f(1 << 20, 0.01f);
  crypto::KeyedStream rounding(sk, 0, 0);
  const double quant =
      perCall(5,
              [&](int) {
                secagg::quantize({8, 1u << 22}, f.data(), f.size(), rounding, v.data());
              }) /
      f.size();
  std::printf(
      "OPS keygen_us=%.2f agree_us=%.2f hkdf_us=%.2f mask_ns_per_value=%.3f "
      "quantize_ns_per_value=%.3f (sink %zu)\n",
      keygen * 1e6, agree * 1e6, hkdf * 1e6, mask * 1e9, quant * 1e9, sink % 2);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t params = 199210;  // the built-in MLP on 28x28 inputs (784-200-200-10)
  int reps = 3;
  std::vector<uint32_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--params") && i + 1 < argc)
      params = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--clients") && i + 1 < argc)
      sizes.push_back(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_secagg [--params P] [--reps R] [--clients N]...\n");
      return 2;
    }
  }
  if (sizes.empty()) sizes = {100, 1000};
  opCosts();
  for (uint32_t n : sizes) clientCost(n, params, reps);
  return 0;
}
