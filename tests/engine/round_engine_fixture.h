// What the RoundEngine tests share: a fixture that drives an engine and answers its
// evaluations, payload and chunk builders, and the base options of a small run.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/compress/codec.h"
#include "engine/round_engine.h"

namespace fedfleet::engine::engine_test {

template <typename T>
std::vector<T> actionsOf(const std::vector<Action>& actions) {
  std::vector<T> out;
  for (const auto& a : actions) {
    if (auto* p = std::get_if<T>(&a)) out.push_back(*p);
  }
  return out;
}

// How many RecordEvent actions of `kind` are in `actions`.
inline int eventsOf(const std::vector<Action>& actions, const std::string& kind) {
  int n = 0;
  for (const auto& e : actionsOf<RecordEvent>(actions)) n += e.event.kind == kind;
  return n;
}

inline wire::Hello hello(const std::string& id, int32_t partition = -1) {
  wire::Hello h;
  h.client_id = id;
  h.requested_partition = partition;
  return h;
}

// A codec "none" payload (header + fp32) holding `v`.
inline std::string floats(const std::vector<float>& v) {
  static const auto codec = std::move(compress::makeCodec(compress::CodecSpec()).value());
  std::string out;
  codec->encode(v.data(), v.size(), 0, &out);
  return out;
}

// A chunk of `v` at `offset`, declaring the update's weight inputs (n samples, 3 steps).
inline wire::Chunk chunkOf(uint64_t token, uint64_t offset, const std::vector<float>& v, bool last,
                           uint64_t n = 10, uint64_t steps = 3) {
  wire::Chunk c;
  c.task_token = token;
  c.offset = offset;
  c.payload = floats(v);
  c.elements = v.size();
  c.last = last;
  c.n_samples = n;
  c.steps = steps;
  return c;
}

struct Fixture {
  EngineOptions options;
  std::unique_ptr<RoundEngine> engine;
  std::vector<Action> log;

  explicit Fixture(EngineOptions o, std::vector<float> params = {0, 0, 0}) : options(o) {
    engine = std::make_unique<RoundEngine>(o, std::move(params));
  }
  // Every commit's rows spell its typed outcome and states, one state a row.
  static void expectSpelledAsTyped(const CommitRound& c) {
    EXPECT_EQ(c.round.status, outcomeName(c.outcome)) << "round " << c.round.round;
    ASSERT_EQ(c.states.size(), c.updates.size()) << "round " << c.round.round;
    for (size_t i = 0; i < c.updates.size(); ++i) {
      EXPECT_EQ(c.updates[i].status, stateName(c.states[i])) << "round " << c.round.round;
    }
  }
  // Takes the actions, answering every Evaluate at once (as the real driver does) with
  // loss = sum of the parameters and accuracy 0.5.
  std::vector<Action> take() {
    std::vector<Action> all;
    while (true) {
      auto a = engine->takeActions();
      if (a.empty()) break;
      for (const auto& action : a) {
        if (auto* c = std::get_if<CommitRound>(&action)) expectSpelledAsTyped(*c);
        if (auto* e = std::get_if<Evaluate>(&action)) {
          double sum = 0;
          for (float v : *e->params) sum += v;
          engine->onEvaluated(e->round, EvalOutcome{sum, 0.5}, 0);
        }
      }
      all.insert(all.end(), a.begin(), a.end());
    }
    log.insert(log.end(), all.begin(), all.end());
    return all;
  }
  // Sends `delta` in chunks of `per_chunk` values, then a summary.
  void upload(const std::string& id, uint64_t token, const std::vector<float>& delta, uint64_t n,
              double now, size_t per_chunk = 2, uint64_t steps = 3, double compute_s = 0) {
    for (size_t off = 0; off < delta.size(); off += per_chunk) {
      size_t len = std::min(per_chunk, delta.size() - off);
      wire::Chunk c =
          chunkOf(token, off, std::vector<float>(delta.begin() + off, delta.begin() + off + len),
                  off + len == delta.size(), n, steps);
      engine->onChunk(id, c, 100, now);
    }
    wire::Summary s;
    s.task_token = token;
    s.n_samples = n;
    s.steps = steps;
    s.compute_seconds = compute_s;
    s.mean_loss = 1.5;
    if (served_echo) {  // the client holds this served model: 20 held-out samples, 65%
      s.served_sha256 = *served_echo;
      s.served_samples = 20;
      s.served_loss = 0.7;
      s.served_accuracy = 0.65;
    }
    engine->onSummary(id, s, 50, now);
  }
  std::optional<wire::Sha256> served_echo;  // what summaries say the client serves (none: unset)
};

inline EngineOptions baseOptions(uint32_t k, uint32_t min_clients, uint32_t quorum) {
  EngineOptions o;
  o.run_id = 7;
  o.rounds = 3;
  o.clients_per_round = k;
  o.min_clients = min_clients;
  o.quorum = quorum;
  o.deadline_s = 10;
  o.liveness_s = 3;
  o.wait_clients_s = 100;
  o.num_partitions = 4;
  o.seed = 42;
  // Updates below claim up to 10 local steps with up to 32 samples: 10 epochs of one batch of
  // 32 plan that many (the planned-steps bound, protocol step 5a).
  o.hparams.epochs = 10;
  return o;
}

// FedBuff: C = 3 clients training at once (and needed to start), K = 2 updates a step, at most
// 5 versions stale, 2 steps.
inline EngineOptions asyncOptions() {
  EngineOptions o = baseOptions(1, 3, 1);
  o.async = true;
  o.async_concurrency = 3;
  o.async_buffer = 2;
  o.max_staleness = 5;
  o.rounds = 2;
  return o;
}

// Starts `engine`, reports round 0's evaluation at once and lets client "a" join; returns the
// tasks it is sent.
inline std::vector<SendTask> startWithClientA(RoundEngine& engine) {
  engine.start(0);
  engine.onEvaluated(0, EvalOutcome{1, 0.1}, 0);
  engine.onHello("a", hello("a"), 0);
  return actionsOf<SendTask>(engine.takeActions());
}

// Client `id` uploads all of `delta` for task `token` as one chunk, then its summary (n = 10,
// 3 steps, mean loss 1, then whatever `edit` changes), at `now`.
inline void uploadWhole(RoundEngine& engine, const ClientId& id, uint64_t token,
                        const std::vector<float>& delta, double now,
                        const std::function<void(wire::Summary&)>& edit = nullptr) {
  engine.onChunk(id, chunkOf(token, 0, delta, true), 100, now);
  wire::Summary s;
  s.task_token = token;
  s.n_samples = 10;
  s.steps = 3;
  s.mean_loss = 1;
  if (edit) edit(s);
  engine.onSummary(id, s, 50, now);
}

inline std::map<std::string, uint64_t> tokensOf(const std::vector<SendTask>& tasks) {
  std::map<std::string, uint64_t> t;
  for (const auto& st : tasks) t[st.client] = st.task.task_token;
  return t;
}

// One round with clients a, b (and more registered) uploading the given deltas; returns the
// commit.
struct Upload {
  std::string client;
  std::vector<float> delta;
  uint64_t n = 1;
  uint64_t steps = 3;
};
inline CommitRound oneRound(Fixture& f, const std::vector<std::string>& ids,
                            const std::vector<Upload>& uploads) {
  f.engine->start(0);
  for (const auto& id : ids) f.engine->onHello(id, hello(id), 0);
  auto token = tokensOf(actionsOf<SendTask>(f.take()));
  double t = 1;
  for (const auto& u : uploads)
    f.upload(u.client, token.at(u.client), u.delta, u.n, t++, 2, u.steps);
  auto commits = actionsOf<CommitRound>(f.take());
  EXPECT_EQ(commits.size(), 1u);
  return commits.empty() ? CommitRound{} : commits[0];
}

}  // namespace fedfleet::engine::engine_test
