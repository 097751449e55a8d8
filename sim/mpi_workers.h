// MPI backend of the simulator's worker pool: one simulation over many processes and hosts.
//
// Under `mpirun -np R fedfleet sim ...` (Open MPI) or Slurm's `srun`, every rank runs the same
// command line. Rank 0 runs the round engine, the virtual clock and the history, exactly as a
// one-process run does, and hands each job (a virtual client's training, a stretch of the
// server's evaluation; common/wire/sim_job.h) as bytes to the next free rank among 1..R-1.
// Those ranks build the same data shards from the same config and seed, run each job with one
// LibTorch thread (sim/sim_jobs.h, as the in-process pool's threads do), and send the result
// back. Results are consumed in virtual-time order, so the history equals the one-process run's
// with the same seed, whatever the number of ranks.
//
// The protocol between the ranks (tags below):
//   1. every worker rank loads its data and sends kReady (empty: ready; else why it cannot);
//   2. rank 0 sends kJob to an idle rank; the rank answers kResult with the same job's result;
//      at most one job is with a rank at a time, so a result names its job by its sender;
//   3. rank 0 sends kStop to every worker rank when the run ends (or fails): they return.
// Every rank polls (MPI_Iprobe / MPI_Test with short sleeps) instead of blocking in MPI, so an
// idle rank costs no core: ranks may outnumber cores (one host, --oversubscribe).
//
// A rank that dies: Open MPI's launcher ends the whole job (rank 0 included) and names the rank
// and its signal. Rounds are committed to the history one transaction at a time, so every
// committed round stays; `fedfleet sim --resume` (under mpirun or not) continues the run.
// Rank 0, told to stop (SIGINT/SIGTERM), fails the jobs it is waiting for with a message saying
// so, instead of waiting for ranks that will not answer.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/config/config.h"
#include "common/status.h"
#include "sim/remote_workers.h"

namespace fedfleet::sim {

// Whether this build has the MPI backend.
bool mpiBuilt();

// Whether this process was started by an MPI launcher as one of several ranks (Open MPI's
// OMPI_COMM_WORLD_SIZE, PMI_SIZE / PMIX_RANK of Slurm and others, with a size above 1).
bool launchedAsMpiJob();

// This process's MPI membership: MPI_Init_thread at start(), MPI_Finalize when destroyed.
class MpiSession {
 public:
  // kUnavailable when this build has no MPI, or MPI does not start (the message says why).
  static Result<std::unique_ptr<MpiSession>> start();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  MpiSession(int rank, int size) : rank_(rank), size_(size) {}
  int rank_ = 0;
  int size_ = 1;
};

// Rank 0: the worker ranks as the simulator's RemoteWorkers. connect() waits for every rank's
// kReady (kUnavailable naming the first rank that could not start, with its reason; the ranks
// are told to stop). `stop`, when set, makes the jobs still waiting fail with a message that
// says the run was stopped. Destroying it tells every rank to stop.
Result<std::shared_ptr<RemoteWorkers>> connectMpiWorkers(const MpiSession& session,
                                                         const std::atomic<bool>* stop);

// Ranks 1..R-1: load the data of `config` (the same shards as rank 0), report ready (or why
// not), then run jobs until rank 0 says stop. Errors: the data could not be loaded (after
// reporting it to rank 0), a message that does not decode.
Status runMpiWorker(const MpiSession& session, const config::Config& config);

}  // namespace fedfleet::sim
