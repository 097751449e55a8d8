// Aggregation throughput: how fast the coordinator folds updates into its running weighted sum,
// against the machine's memory bandwidth measured in the same run.
//
// 64 updates of 10M parameters are folded into one fp32 accumulator with all cores, threads
// over ranges: the parameters are cut into payload chunks of 256Ki elements (1 MiB of fp32, the
// client's upload chunk), thread t owns a contiguous run of chunks and folds every update's
// chunks of its run, so no two threads touch the same accumulator line. Each chunk is one
// payload, decoded and folded by the path the coordinator is to use
// (compress::decodeAccumulatePayload: header and content checks, then the fused kernel).
//
// Memory: 64 distinct fp32 updates would be 2.5 GB, so a few distinct updates (4 dense, 8 QSGD,
// 8 top-k) are generated once and cycled, every one folded with its own weight. The dense and
// QSGD sets are larger than the last-level cache, so their folds read the payloads from DRAM;
// the top-k set (8 x 330 KB) is not, as a round's buffered sparse payloads would not be.
//
// Figures (medians over the repetitions; each repetition runs every measurement once, in turn):
//   triad_gbs       STREAM triad a[i] = b[i] + s * c[i] over 3 x 10M floats, all cores,
//                   12 bytes an element (STREAM's count)
//   dense_gbs       dense fp32 folding ("none" payloads): update read + accumulator read and
//                   written, 12 bytes a parameter
//   q8_gparams      QSGD 8-bit payloads folded (decode + accumulate), parameters per second
//   topk_mnnz_per_s top-k 1% payloads folded, millions of (index, value) pairs per second
//   topk_chunk_major_mnnz_per_s  the same top-k folds chunk by chunk across the updates (the
//                   accumulator chunk stays in cache), for reference: a coordinator that buffers a
//                   round's sparse payloads could fold them so
// RESULT keys: dense_ratio = dense_gbs / triad_gbs (goal >= 0.9), q8_ratio = q8 parameters/s
// over dense parameters/s (goal >= 0.8), topk_mnnz_per_s (goal >= 100), then
// topk_chunk_major_mnnz_per_s (no goal). Exit status 0 when the three goals hold, else 1.
//
// Flags: --params N (10000000) --updates U (64) --reps R (5) --threads T (all cores)
//        --chunk C (262144) --topk-ratio F (0.01)

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/payload.h"
#include "kernels/accumulate.h"

namespace {

using fedfleet::compress::CodecSpec;
using Clock = std::chrono::steady_clock;

struct Options {
  size_t params = 10'000'000;
  size_t updates = 64;
  size_t reps = 5;
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  size_t chunk = 262144;
  double topk_ratio = 0.01;
};

Options parseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--params")
      o.params = std::strtoull(next(), nullptr, 10);
    else if (a == "--updates")
      o.updates = std::strtoull(next(), nullptr, 10);
    else if (a == "--reps")
      o.reps = std::strtoull(next(), nullptr, 10);
    else if (a == "--threads")
      o.threads = std::strtoull(next(), nullptr, 10);
    else if (a == "--chunk")
      o.chunk = std::strtoull(next(), nullptr, 10);
    else if (a == "--topk-ratio")
      o.topk_ratio = std::strtod(next(), nullptr);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.params == 0 || o.updates == 0 || o.reps == 0 || o.threads == 0 || o.chunk == 0) {
    std::fprintf(stderr, "all sizes must be positive\n");
    std::exit(2);
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Runs body(thread) on `threads` persistent workers at each call of run(); returns seconds.
class Team {
 public:
  explicit Team(size_t threads) : start_(threads + 1), done_(threads + 1) {
    for (size_t t = 0; t < threads; ++t) {
      workers_.emplace_back([this, t] {
        while (true) {
          start_.arrive_and_wait();
          if (stop_) return;
          (*body_)(t);
          done_.arrive_and_wait();
        }
      });
    }
  }
  ~Team() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& w : workers_) w.join();
  }
  double run(const std::function<void(size_t)>& body) {
    body_ = &body;
    const auto t0 = Clock::now();
    start_.arrive_and_wait();
    done_.arrive_and_wait();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  std::barrier<> start_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(size_t)>* body_ = nullptr;
  bool stop_ = false;
};

// [begin, end) of thread t's share of `count` items.
std::pair<size_t, size_t> share(size_t count, size_t threads, size_t t) {
  return {count * t / threads, count * (t + 1) / threads};
}

// One update encoded as payload chunks.
using Chunked = std::vector<std::string>;

}  // namespace

int main(int argc, char** argv) {
  const Options o = parseArgs(argc, argv);
  const size_t n = o.params;
  const size_t chunks = (n + o.chunk - 1) / o.chunk;
  const size_t T = o.threads;
  std::printf(
      "aggregate_bw: %zu updates of %zu parameters, %zu threads, %zu chunks of %zu, %zu reps\n",
      o.updates, n, T, chunks, o.chunk, o.reps);
  Team team(T);

  // Buffers, first touched by the threads that use them.
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]), acc(new float[n]);
  team.run([&](size_t t) {
    const auto [lo, hi] = share(n, T, t);
    for (size_t i = lo; i < hi; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f, acc[i] = 0.0f;
  });

  // Distinct updates: Gaussian deltas with a per-update scale, encoded chunk by chunk.
  auto makeUpdates = [&](const std::string& codec_text, size_t distinct) {
    const CodecSpec spec = fedfleet::compress::parseCodecSpec(codec_text).value();
    const auto codec = std::move(fedfleet::compress::makeCodec(spec)).value();
    std::vector<Chunked> out(distinct, Chunked(chunks));
    std::vector<float> x(n);
    for (size_t d = 0; d < distinct; ++d) {
      team.run([&](size_t t) {
        const auto [lo, hi] = share(n, T, t);
        std::mt19937 gen(static_cast<uint32_t>(1000 * d + t));
        std::normal_distribution<float> dist(0.0f, 0.01f * static_cast<float>(d + 1));
        for (size_t i = lo; i < hi; ++i) x[i] = dist(gen);
      });
      team.run([&](size_t t) {
        const auto [lo, hi] = share(chunks, T, t);
        for (size_t ch = lo; ch < hi; ++ch) {
          const size_t off = ch * o.chunk, len = std::min(o.chunk, n - off);
          codec->encode(x.data() + off, len, d * chunks + ch, &out[d][ch]);
        }
      });
    }
    return out;
  };
  const auto t_gen = Clock::now();
  const std::vector<Chunked> dense = makeUpdates("none", 4);
  const std::vector<Chunked> q8 = makeUpdates("qsgd8", 8);
  const std::vector<Chunked> topk = makeUpdates("topk:" + std::to_string(o.topk_ratio), 8);
  size_t topk_nnz_per_cycle = 0;  // nnz summed over the updates folded in one measurement
  for (size_t u = 0; u < o.updates; ++u) {
    for (const std::string& p : topk[u % topk.size()]) {
      topk_nnz_per_cycle += fedfleet::compress::readPayloadHeader(p).value().param;
    }
  }
  std::printf("generated and encoded the distinct updates in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - t_gen).count());

  // Folds every update's chunks of each thread's run; any payload error aborts the benchmark.
  auto fold = [&](const std::vector<Chunked>& updates) {
    return team.run([&](size_t t) {
      const auto [lo, hi] = share(chunks, T, t);
      for (size_t u = 0; u < o.updates; ++u) {
        const Chunked& update = updates[u % updates.size()];
        const float w = 1.0f / static_cast<float>(u + 1);
        for (size_t ch = lo; ch < hi; ++ch) {
          const size_t off = ch * o.chunk, len = std::min(o.chunk, n - off);
          const fedfleet::Status st =
              fedfleet::compress::decodeAccumulatePayload(update[ch], len, w, acc.get() + off);
          if (!st.isOk()) {
            std::fprintf(stderr, "fold failed: %s\n", st.toString().c_str());
            std::abort();
          }
        }
      }
    });
  };
  // The same folds in the other order: each thread takes its chunks one at a time and folds that
  // chunk of every update before moving on, as a coordinator would that buffers the (small)
  // sparse payloads of a round and folds them together; the accumulator's chunk then stays in
  // cache. For reference only: the goals are judged on the streaming order above, in which
  // updates arrive and are folded one after another.
  auto foldChunkMajor = [&](const std::vector<Chunked>& updates) {
    return team.run([&](size_t t) {
      const auto [lo, hi] = share(chunks, T, t);
      for (size_t ch = lo; ch < hi; ++ch) {
        const size_t off = ch * o.chunk, len = std::min(o.chunk, n - off);
        for (size_t u = 0; u < o.updates; ++u) {
          const fedfleet::Status st = fedfleet::compress::decodeAccumulatePayload(
              updates[u % updates.size()][ch], len, 1.0f / static_cast<float>(u + 1),
              acc.get() + off);
          if (!st.isOk()) {
            std::fprintf(stderr, "fold failed: %s\n", st.toString().c_str());
            std::abort();
          }
        }
      }
    });
  };
  // The raw kernel on fp32 arrays (no payload, no checks), for reference only.
  std::vector<std::unique_ptr<float[]>> raw;
  for (size_t d = 0; d < 2; ++d) {
    raw.emplace_back(new float[n]);
    float* r = raw.back().get();
    team.run([&](size_t t) {
      const auto [lo, hi] = share(n, T, t);
      for (size_t i = lo; i < hi; ++i) r[i] = 0.001f * static_cast<float>(d + 1);
    });
  }
  auto foldRaw = [&]() {
    return team.run([&](size_t t) {
      const auto [lo, hi] = share(n, T, t);
      for (size_t u = 0; u < o.updates; ++u) {
        fedfleet::kernels::weightedAccumulate(acc.get() + lo, raw[u % raw.size()].get() + lo,
                                              1.0f / static_cast<float>(u + 1), hi - lo);
      }
    });
  };
  // STREAM triad, repeated `o.updates / 4` times a measurement so that it runs about as long
  // as the folds (the median then compares like with like).
  const size_t triad_passes = std::max<size_t>(1, o.updates / 4);
  auto triad = [&]() {
    return team.run([&](size_t t) {
      const auto [lo, hi] = share(n, T, t);
      float* __restrict pa = a.get();
      const float* __restrict pb = b.get();
      const float* __restrict pc = c.get();
      for (size_t pass = 0; pass < triad_passes; ++pass) {
        const float s = 0.5f + static_cast<float>(pass & 1);
        for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
      }
    });
  };

  // Warm-up (page faults, ifunc resolution), then the repetitions.
  triad();
  fold(dense);
  std::vector<double> triad_s, dense_s, raw_s, q8_s, topk_s, topk_chunk_s;
  for (size_t r = 0; r < o.reps; ++r) {
    triad_s.push_back(triad() / static_cast<double>(triad_passes));
    dense_s.push_back(fold(dense));
    raw_s.push_back(foldRaw());
    q8_s.push_back(fold(q8));
    topk_s.push_back(fold(topk));
    topk_chunk_s.push_back(foldChunkMajor(topk));
    std::printf(
        "rep %zu: triad %.4f s/pass, dense %.3f s, raw kernel %.3f s, qsgd8 %.3f s, "
        "topk %.3f s, topk chunk-major %.3f s\n",
        r, triad_s.back(), dense_s.back(), raw_s.back(), q8_s.back(), topk_s.back(),
        topk_chunk_s.back());
  }
  const double U = static_cast<double>(o.updates), N = static_cast<double>(n);
  const double triad_gbs = 12.0 * N / median(triad_s) / 1e9;
  const double dense_gbs = 12.0 * N * U / median(dense_s) / 1e9;
  const double raw_gbs = 12.0 * N * U / median(raw_s) / 1e9;
  const double dense_gparams = N * U / median(dense_s) / 1e9;
  const double q8_gparams = N * U / median(q8_s) / 1e9;
  const double topk_mnnz = static_cast<double>(topk_nnz_per_cycle) / median(topk_s) / 1e6;
  const double topk_chunk_mnnz =
      static_cast<double>(topk_nnz_per_cycle) / median(topk_chunk_s) / 1e6;
  const double dense_ratio = dense_gbs / triad_gbs;
  const double q8_ratio = q8_gparams / dense_gparams;
  std::printf("triad            %8.2f GB/s\n", triad_gbs);
  std::printf(
      "dense fp32 fold  %8.2f GB/s  (%.3f Gparams/s; raw kernel without payload checks %.2f "
      "GB/s)\n",
      dense_gbs, dense_gparams, raw_gbs);
  std::printf("qsgd8 fold       %8.3f Gparams/s (%.2f GB/s of payload + accumulator traffic)\n",
              q8_gparams, q8_gparams * 9.0);
  std::printf("topk fold        %8.1f M (index, value) pairs/s, %zu pairs an update cycle\n",
              topk_mnnz, topk_nnz_per_cycle);
  std::printf(
      "topk chunk-major %8.1f M pairs/s (buffered updates folded chunk by chunk; reference)\n",
      topk_chunk_mnnz);
  const bool ok = dense_ratio >= 0.9 && q8_ratio >= 0.8 && topk_mnnz >= 100.0;
  std::printf("goals: dense_ratio >= 0.9 %s, q8_ratio >= 0.8 %s, topk_mnnz_per_s >= 100 %s\n",
              dense_ratio >= 0.9 ? "met" : "MISSED", q8_ratio >= 0.8 ? "met" : "MISSED",
              topk_mnnz >= 100.0 ? "met" : "MISSED");
  std::printf(
      "RESULT dense_ratio=%.3f q8_ratio=%.3f topk_mnnz_per_s=%.1f "
      "topk_chunk_major_mnnz_per_s=%.1f\n",
      dense_ratio, q8_ratio, topk_mnnz, topk_chunk_mnnz);
  return ok ? 0 : 1;
}
