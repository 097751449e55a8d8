// RemoteWorkers: where the simulator's jobs run when they leave this process.
//
// The fleet simulator hands its jobs (common/wire/sim_job.h, as bytes) to a RemoteWorkers when
// it has one, instead of running them on its own threads: the MPI backend (sim/mpi_workers.h)
// sends each to a free rank. Results come back as bytes through the future, in whatever order
// the workers finish; the simulator consumes them in virtual-time order, so the history does not
// depend on which worker ran what.
#pragma once

#include <cstddef>
#include <future>
#include <string>

#include "common/status.h"

namespace fedfleet::sim {

class RemoteWorkers {
 public:
  virtual ~RemoteWorkers() = default;
  // Queues `job` (wire::encodeSimJob bytes) for the next free worker. The future holds the
  // result's bytes (wire::decodeSimJobResult), or kUnavailable when no worker will answer (the
  // backend was shut down, a worker is gone).
  virtual std::future<Result<std::string>> submit(std::string job) = 0;
  // What runs the jobs, for the log ("2 MPI worker ranks").
  virtual std::string describe() const = 0;
};

}  // namespace fedfleet::sim
