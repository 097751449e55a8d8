#include "engine/participant.h"

#include "common/crypto/sha256.h"

namespace fedfleet::engine {

const char* stateName(UpdateState state) {
  static const char* kNames[] = {"pending", "completed", "late", "dropped", "rejected"};
  return kNames[static_cast<int>(state)];
}

history::UpdateRecord updateRecord(const Participant& p, int64_t run_id, uint32_t round,
                                   double weight, double now) {
  history::UpdateRecord u;
  u.run_id = run_id;
  u.round = round;
  u.client_id = p.client;
  u.partition = static_cast<int32_t>(p.partition);
  u.n_samples = p.summary.n_samples;
  u.steps = p.summary.steps;
  u.loss = p.summary.mean_loss;
  u.compute_s = p.summary.compute_seconds;
  u.upload_s = p.summary.upload_seconds;
  u.bytes_up = p.bytes_up;
  u.bytes_down = p.bytes_down;
  u.weight = p.state == UpdateState::kCompleted ? weight : 0.0;
  u.codec = p.codec;
  u.encode_s = p.summary.encode_seconds;
  u.start_time = p.sent_at;
  u.end_time = p.finished_at >= 0 ? p.finished_at : now;
  if (p.upload_asked_at >= 0) {  // waited for its grant until granted, else until it ended
    u.grant_wait_s = (p.granted_at >= 0 ? p.granted_at : u.end_time) - p.upload_asked_at;
  }
  u.status = stateName(p.state);
  if (p.fed_eval && p.summary.eval_samples > 0) {
    u.eval_samples = p.summary.eval_samples;
    u.eval_loss = p.summary.eval_loss;
    if (p.summary.eval_has_accuracy) u.eval_accuracy = p.summary.eval_accuracy;
    u.eval_metrics = p.summary.eval_metrics;
  }
  if (p.served.source != wire::ServedSource::kNone) {
    u.served_block = static_cast<int32_t>(p.served.block);
    u.served_model = p.served.model;
    u.served_version = p.served.version;
    u.served_sha256_hex = crypto::toHex(p.served.sha256);
    u.served_bytes = p.served_bytes;
    u.served_samples = p.summary.served_samples;
    if (p.summary.served_samples > 0) {
      u.served_loss = p.summary.served_loss;
      u.served_accuracy = p.summary.served_accuracy;
    }
  }
  return u;
}

}  // namespace fedfleet::engine
