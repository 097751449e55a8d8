// CoordinatorService: the real-process driver of the RoundEngine.
//
// It owns the ROUTER transport (CURVE by default), the history store, the test set and the
// evaluation model, and runs one event loop on the calling thread:
//   receive a frame (waiting at most until the engine's next wake-up) -> decode it -> map the
//   sender to a client id -> feed the engine -> carry out the engine's actions (encode and send
//   tasks, cancels, errors and goodbyes; write history) -> repeat.
// Threads: the loop thread owns the socket, the engine and the store; ZeroMQ's I/O threads do the
// encryption; the ZAP handler thread only answers authentication requests.
//
// Identity: under CURVE a connection is the client its authenticated key belongs to (the
// allow-list file's name, which the ZAP handler attaches to the connection), never what a
// routing id or a message says. A Hello that names another client id or key is refused; the
// same key on a new connection replaces the old one (closed and recorded); a key removed from
// the allow-list is disconnected at once. Under --insecure a client is whatever its Hello
// claims: anyone can be anyone. Frames that do not decode or break a limit on what a client
// may send, and messages before Hello, are answered with an Error and recorded (within a
// per-client budget of rows); a connection over its rate of such frames, Hellos or heartbeats
// is closed (coordinator/connection_limits.h). The loop keeps serving.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/config/config.h"
#include "common/status.h"
#include "engine/aggregator.h"

namespace fedfleet::coordinator {

class CoordinatorService {
 public:
  // Loads keys, data, model and history and binds the socket. Every problem (missing key file,
  // bad endpoint, unreadable data, a history database it cannot open, a checkpoint that does not
  // fit the model) is returned as a Status with a message that names the file or key.
  // `custom_aggregator` builds the aggregator of aggregation.method = "custom" (a Python
  // strategy; it runs on the service's thread); without it that method is refused.
  static Result<std::unique_ptr<CoordinatorService>> create(
      const config::Config& config, engine::AggregatorFactory custom_aggregator = nullptr);

  virtual ~CoordinatorService() = default;

  // Runs until the last round is committed (OK), the run fails (clients never came: kTimeout),
  // the history cannot be written (kIoError; the round in memory is reported, not silently
  // dropped) or stop() is called (OK: a round whose evaluation is running is committed first,
  // the round in flight is abandoned, a run_interrupted event says where the run stopped, and
  // --resume continues it). With --resume of a run that already finished it only logs so and
  // returns OK.
  virtual Status run() = 0;

  // Asks run() to return soon. Safe from any thread and from a signal handler.
  virtual void stop() = 0;
  // Asks run() to re-read the allow-list (SIGHUP): keys removed since are disconnected at once
  // and recorded. Safe from any thread and from a signal handler.
  virtual void reloadAllowList() = 0;

  virtual std::string boundEndpoint() const = 0;
  virtual int64_t runId() const = 0;
};

}  // namespace fedfleet::coordinator
