// ClientRuntime: a client process's loop. It says Hello, trains the tasks the coordinator
// sends, uploads each delta in chunks followed by a Summary, and keeps the connection alive.
//
// Threads: the calling thread owns the DEALER socket and does all sends and receives; local
// training runs on one worker thread at a time (LibTorch intra-op threads as configured). A
// Cancel, a deadline or a coordinator error about the task sets the worker's stop flag; its
// result is then discarded, never uploaded.
//
// Reconnection: the coordinator answers every Heartbeat. When it has been silent for
// `liveness_s` (for example it restarted), or answers with "unknown client", the runtime says
// Hello again; ZeroMQ reconnects the socket underneath.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/transport/transport.h"

namespace fedfleet::client {

struct ClientRuntimeOptions {
  transport::ClientOptions transport;  // endpoint, keys, routing id
  std::string client_id;
  std::string device = "auto";   // auto, cpu, cuda
  std::string data_dir;          // Fashion-MNIST IDX files; empty: the Debian package's
  std::string torchscript_path;  // for tasks naming the "torchscript" model
  uint32_t threads = 1;          // LibTorch intra-op threads
  int32_t partition = -1;        // partition to ask for (-1: any)
  double heartbeat_s = 1;
  double liveness_s = 5;   // coordinator silence before saying Hello again
  double exit_idle_s = 0;  // give up after this much silence (0: never)
};

class ClientRuntime {
 public:
  // Connects (asynchronously) and resolves the device. Errors: bad device spec, transport
  // options rejected.
  static Result<std::unique_ptr<ClientRuntime>> create(const ClientRuntimeOptions& options);
  virtual ~ClientRuntime() = default;

  // Runs until the coordinator says Bye (OK), stop() is called (kUnavailable) or the
  // coordinator stays silent for exit_idle_s (kTimeout).
  virtual Status run() = 0;
  virtual void stop() = 0;  // safe from any thread and from a signal handler
};

}  // namespace fedfleet::client
