// A small deterministic driver for PeerEngines in tests: virtual time, each peer's Compute takes
// its own duration, messages arrive `latency` after they are sent (FIFO), and a delta function
// stands in for training.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <variant>
#include <vector>

#include "peer/group_generator.h"
#include "peer/peer_engine.h"

namespace fedfleet::peer::testing {

struct ComputeRecord {
  uint32_t peer;
  uint64_t iteration;
  std::vector<float> params;
};

class PeerHarness {
 public:
  using DeltaFn = std::function<std::vector<float>(uint32_t peer, uint64_t iteration,
                                                   const std::vector<float>&)>;

  PeerHarness(const PeerOptions& o, std::vector<std::vector<float>> initial, DeltaFn delta)
      : options_(o), delta_(std::move(delta)), compute_s_(o.peers, 1.0) {
    for (uint32_t i = 0; i < o.peers; ++i) {
      engines.push_back(std::make_unique<PeerEngine>(o, i, initial[i]));
    }
    if (o.algorithm == Algorithm::kPrague) {
      generator.emplace(o.peers, o.group_size, o.group_buffer, o.seed);
    }
    done.resize(o.peers);
  }

  void setComputeSeconds(uint32_t peer, double s) { compute_s_[peer] = s; }
  void setLatency(double s) { latency_ = s; }
  // Kill `peer` at virtual time `at`.
  void killAt(uint32_t peer, double at) { push(at, Event{Kill{peer}}); }

  // Runs until nothing is left to do (or `max_events`). Returns the events processed.
  size_t run(size_t max_events = 1000000) {
    for (uint32_t i = 0; i < engines.size(); ++i) handle(i, engines[i]->start());
    size_t n = 0;
    while (!events_.empty() && n < max_events) {
      auto [t, seq, ev] = events_.top();
      events_.pop();
      now_ = t;
      ++n;
      if (auto* c = std::get_if<ComputeDone>(&ev)) {
        if (dead_.count(c->peer)) continue;
        auto delta = delta_(c->peer, c->iteration, c->params);
        handle(c->peer, engines[c->peer]->onComputed(c->iteration, std::move(delta), 10, 0.5));
      } else if (auto* m = std::get_if<Deliver>(&ev)) {
        const uint32_t to = m->message.to;
        if (dead_.count(to) || dead_.count(m->message.from)) continue;
        if (to == options_.peers) {
          auto r = generator->onMessage(m->message, now_);
          if (!r.isOk()) {
            fails.push_back(r.status());
            continue;
          }
          for (auto& s : r.value()) send(std::move(s));
        } else {
          handle(to, engines[to]->onMessage(std::move(m->message)));
        }
      } else if (auto* k = std::get_if<Kill>(&ev)) {
        dead_.insert(k->peer);
        if (generator) {
          for (auto& s : generator->onPeerDown(k->peer, now_)) send(std::move(s));
        }
        for (uint32_t i = 0; i < engines.size(); ++i) {
          if (!dead_.count(i)) handle(i, engines[i]->onPeerDown(k->peer));
        }
      }
    }
    return n;
  }

  double now() const { return now_; }

  std::vector<std::unique_ptr<PeerEngine>> engines;
  std::optional<GroupGenerator> generator;
  std::vector<ComputeRecord> computes;
  std::vector<std::vector<IterationDone>> done;
  std::vector<PeerMessage> sent;
  std::vector<Status> fails;
  std::vector<uint32_t> failed_peers;
  std::vector<uint32_t> finished;

 private:
  struct ComputeDone {
    uint32_t peer;
    uint64_t iteration;
    std::vector<float> params;
  };
  struct Deliver {
    PeerMessage message;
  };
  struct Kill {
    uint32_t peer;
  };
  using Event = std::variant<ComputeDone, Deliver, Kill>;
  struct Entry {
    double t;
    uint64_t seq;
    Event ev;
    bool operator>(const Entry& o) const { return std::tie(t, seq) > std::tie(o.t, o.seq); }
  };

  void push(double t, Event e) { events_.push(Entry{t, seq_++, std::move(e)}); }

  void send(PeerMessage m) {
    sent.push_back(m);
    push(now_ + latency_, Event{Deliver{std::move(m)}});
  }

  void handle(uint32_t peer, std::vector<PeerAction> actions) {
    for (auto& a : actions) {
      if (auto* c = std::get_if<Compute>(&a)) {
        computes.push_back({peer, c->iteration, *c->params});
        push(now_ + compute_s_[peer], Event{ComputeDone{peer, c->iteration, *c->params}});
      } else if (auto* s = std::get_if<Send>(&a)) {
        send(std::move(s->message));
      } else if (auto* d = std::get_if<IterationDone>(&a)) {
        done[peer].push_back(*d);
      } else if (std::holds_alternative<Finished>(a)) {
        finished.push_back(peer);
      } else if (auto* f = std::get_if<Fail>(&a)) {
        fails.push_back(f->status);
        failed_peers.push_back(peer);
      }
    }
  }

  PeerOptions options_;
  DeltaFn delta_;
  std::vector<double> compute_s_;
  double latency_ = 0.001;
  double now_ = 0;
  uint64_t seq_ = 0;
  std::set<uint32_t> dead_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> events_;
};

}  // namespace fedfleet::peer::testing
