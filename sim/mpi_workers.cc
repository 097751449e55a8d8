#include "sim/mpi_workers.h"

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/wire/sim_job.h"
#include "sim/fleet_data.h"
#include "sim/sim_jobs.h"

#ifdef FEDFLEET_HAVE_MPI
// The C API only: no MPI C++ bindings (Open MPI's and MPICH's deprecated mpicxx layer).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace fedfleet::sim {

bool launchedAsMpiJob() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > 1) return true;
  }
  // Slurm with PMIx sets the rank but not always the size: the task count says it.
  const char* tasks = std::getenv("SLURM_NTASKS");
  return std::getenv("PMIX_RANK") != nullptr && tasks != nullptr && std::atoi(tasks) > 1;
}

#ifndef FEDFLEET_HAVE_MPI

bool mpiBuilt() { return false; }

Result<std::unique_ptr<MpiSession>> MpiSession::start() {
  return unavailable(
      "this fedfleet was built without MPI (install libopenmpi-dev and rebuild): run `fedfleet "
      "sim` without mpirun");
}
MpiSession::~MpiSession() = default;

Result<std::shared_ptr<RemoteWorkers>> connectMpiWorkers(const MpiSession&,
                                                         const std::atomic<bool>*) {
  return unavailable("this fedfleet was built without MPI");
}
Status runMpiWorker(const MpiSession&, const config::Config&) {
  return unavailable("this fedfleet was built without MPI");
}

#else

namespace {

enum Tag : int { kReady = 1, kJob = 2, kResult = 3, kStop = 4 };

// Sleeps between polls: short while messages flow, up to a millisecond when idle.
class Backoff {
 public:
  void busy() { wait_ = kMin; }
  void idle() {
    std::this_thread::sleep_for(wait_);
    wait_ = std::min(wait_ * 2, kMax);
  }

 private:
  static constexpr std::chrono::microseconds kMin{20};
  static constexpr std::chrono::microseconds kMax{1000};
  std::chrono::microseconds wait_ = kMin;
};

Status mpiError(const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return unavailable(std::string(call) + " failed: " + std::string(text, len));
}

// Receives the message `st` announced (MPI_Iprobe) into a string.
Result<std::string> receive(const MPI_Status& probed) {
  int count = 0;
  MPI_Get_count(&probed, MPI_BYTE, &count);
  std::string bytes(static_cast<size_t>(count), '\0');
  MPI_Status st;
  const int rc = MPI_Recv(bytes.data(), count, MPI_BYTE, probed.MPI_SOURCE, probed.MPI_TAG,
                          MPI_COMM_WORLD, &st);
  if (rc != MPI_SUCCESS) return mpiError("MPI_Recv", rc);
  return bytes;
}

// OK when `bytes` fit one MPI message (an int count of bytes).
Status fitsOneMessage(const std::string& bytes) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return resourceExhausted("a simulator job of " + std::to_string(bytes.size()) +
                             " bytes is over MPI's 2 GiB message limit");
  }
  return Status::ok();
}

// Sends without blocking inside MPI (the wait polls), so a rank never spins a core.
Status sendPolling(const std::string& bytes, int to, int tag) {
  FEDFLEET_RETURN_IF_ERROR(fitsOneMessage(bytes));
  MPI_Request req;
  int rc = MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, tag,
                     MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpiError("MPI_Isend", rc);
  Backoff backoff;
  for (int done = 0; !done;) {
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpiError("MPI_Test", rc);
    if (!done) backoff.idle();
  }
  return Status::ok();
}

class MpiWorkers final : public RemoteWorkers {
 public:
  MpiWorkers(int size, const std::atomic<bool>* stop) : size_(size), stop_(stop) {
    thread_ = std::thread([this] { loop(); });
  }
  ~MpiWorkers() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    thread_.join();
  }

  std::future<Result<std::string>> submit(std::string job) override {
    std::promise<Result<std::string>> reply;
    auto out = reply.get_future();
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      reply.set_value(unavailable("the MPI workers were shut down"));
    } else {
      queue_.push_back({std::move(job), std::move(reply)});
    }
    return out;
  }

  std::string describe() const override {
    return std::to_string(size_ - 1) + " MPI worker rank" + (size_ == 2 ? "" : "s");
  }

 private:
  struct Pending {
    std::string job;
    std::promise<Result<std::string>> reply;
  };

  // The one thread that calls MPI on rank 0 (MPI_THREAD_SERIALIZED).
  void loop() {
    std::deque<Pending> waiting;
    std::vector<std::optional<Pending>> busy(static_cast<size_t>(size_));  // by rank
    std::vector<MPI_Request> sends(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    Backoff backoff;
    auto failAll = [&](const Status& why) {
      for (auto& p : waiting) p.reply.set_value(why);
      waiting.clear();
      for (auto& b : busy) {
        if (b) b->reply.set_value(why);
        b.reset();
      }
    };
    while (true) {
      bool progressed = false;
      bool closing = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        closing = closing_;
        while (!queue_.empty()) {
          waiting.push_back(std::move(queue_.front()));
          queue_.pop_front();
          progressed = true;
        }
        if (closing) closed_ = true;
      }
      if (stop_ != nullptr && stop_->load()) {
        failAll(unavailable(
            "the simulation was stopped (a signal: the MPI launcher ends every rank when one "
            "dies); every committed round is in the history: continue it with --resume"));
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
        break;
      }
      if (closing) {  // nobody waits for queued jobs any more; in-flight ones finish first
        failQueued(waiting);
      }
      for (int r = 1; r < size_; ++r) {
        if (busy[r] || waiting.empty()) continue;
        busy[r] = std::move(waiting.front());
        waiting.pop_front();
        const std::string& bytes = busy[r]->job;
        if (Status fits = fitsOneMessage(bytes); !fits.isOk()) {
          busy[r]->reply.set_value(fits);
          busy[r].reset();
          continue;
        }
        MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, r, kJob, MPI_COMM_WORLD,
                  &sends[r]);
        progressed = true;
      }
      for (int r = 1; r < size_; ++r) {
        if (sends[r] == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&sends[r], &done, MPI_STATUS_IGNORE);  // sets it to MPI_REQUEST_NULL when done
      }
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kResult, MPI_COMM_WORLD, &flag, &st);
      if (flag) {
        Result<std::string> bytes = receive(st);
        const int r = st.MPI_SOURCE;
        if (r > 0 && r < size_ && busy[r]) {
          if (sends[r] != MPI_REQUEST_NULL) MPI_Wait(&sends[r], MPI_STATUS_IGNORE);
          busy[r]->reply.set_value(std::move(bytes));
          busy[r].reset();
        } else {
          spdlog::warn("sim: MPI rank {} sent a result for no job; ignored", r);
        }
        progressed = true;
      }
      if (closing && waiting.empty()) {
        bool idle = true;
        for (const auto& b : busy) idle = idle && !b;
        if (idle) break;
      }
      if (progressed) {
        backoff.busy();
      } else {
        backoff.idle();
      }
    }
    for (int r = 1; r < size_; ++r) {
      if (sends[r] != MPI_REQUEST_NULL) MPI_Cancel(&sends[r]);
      MPI_Send(nullptr, 0, MPI_BYTE, r, kStop, MPI_COMM_WORLD);
    }
  }

  static void failQueued(std::deque<Pending>& waiting) {
    for (auto& p : waiting) p.reply.set_value(unavailable("the MPI workers were shut down"));
    waiting.clear();
  }

  const int size_;
  const std::atomic<bool>* stop_;
  std::mutex mu_;
  std::deque<Pending> queue_;  // GUARDED_BY(mu_)
  bool closing_ = false;       // GUARDED_BY(mu_)
  bool closed_ = false;        // GUARDED_BY(mu_)
  std::thread thread_;
};

// Tells every worker rank to stop (after a failed start).
void stopWorkers(int size) {
  for (int r = 1; r < size; ++r) MPI_Send(nullptr, 0, MPI_BYTE, r, kStop, MPI_COMM_WORLD);
}

}  // namespace

bool mpiBuilt() { return true; }

Result<std::unique_ptr<MpiSession>> MpiSession::start() {
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) return mpiError("MPI_Init_thread", rc);
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return unavailable(
        "this MPI library does not allow MPI calls from a thread other than the "
        "main one (MPI_THREAD_SERIALIZED), which rank 0 needs");
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<MpiSession>(new MpiSession(rank, size));
}

MpiSession::~MpiSession() { MPI_Finalize(); }

Result<std::shared_ptr<RemoteWorkers>> connectMpiWorkers(const MpiSession& session,
                                                         const std::atomic<bool>* stop) {
  if (session.rank() != 0) return failedPrecondition("only rank 0 runs the simulation");
  if (session.size() < 2) {
    return invalidArgument(
        "an MPI simulation needs at least 2 ranks: rank 0 runs the engine, "
        "the others train");
  }
  int ready = 0;
  Status first_failure;
  Backoff backoff;
  while (ready < session.size() - 1) {
    if (stop != nullptr && stop->load()) {
      stopWorkers(session.size());
      return unavailable("stopped while waiting for the MPI worker ranks");
    }
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kReady, MPI_COMM_WORLD, &flag, &st);
    if (!flag) {
      backoff.idle();
      continue;
    }
    Result<std::string> why = receive(st);
    ++ready;
    const std::string reason = why.isOk() ? *why : why.status().toString();
    if (!reason.empty() && first_failure.isOk()) {
      first_failure =
          unavailable("MPI rank " + std::to_string(st.MPI_SOURCE) + " could not start: " + reason);
    }
  }
  if (!first_failure.isOk()) {
    stopWorkers(session.size());
    return first_failure;
  }
  return std::shared_ptr<RemoteWorkers>(std::make_shared<MpiWorkers>(session.size(), stop));
}

Status runMpiWorker(const MpiSession& session, const config::Config& config) {
  at::set_num_threads(1);  // one LibTorch thread, as each in-process worker has
  Result<std::unique_ptr<FleetData>> data = [&]() -> Result<std::unique_ptr<FleetData>> {
    config::Config c = config;
    FEDFLEET_RETURN_IF_ERROR(c.validate());
    FEDFLEET_RETURN_IF_ERROR(deviceOf(config::choiceName(c.sim.device)).status());
    return FleetData::create(c, c.sim.clients);
  }();
  const std::string ready = data.isOk() ? "" : data.status().toString();
  if (data.isOk()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    spdlog::info("sim: MPI rank {} (pid {}) on {} ready: {} virtual clients' data", session.rank(),
                 static_cast<long>(getpid()), host, config.sim.clients);
  }
  FEDFLEET_RETURN_IF_ERROR(sendPolling(ready, 0, kReady));
  Backoff backoff;
  while (true) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
    if (!flag) {
      backoff.idle();
      continue;
    }
    backoff.busy();
    FEDFLEET_ASSIGN_OR_RETURN(std::string bytes, receive(st));
    if (st.MPI_TAG == kStop) return data.isOk() ? Status::ok() : data.status();
    if (st.MPI_TAG != kJob || !data.isOk()) continue;
    Result<wire::SimJob> job = wire::decodeSimJob(bytes);
    wire::SimJobResult result;
    if (job.isOk()) {
      result = runJob(*job, **data);
    } else {
      wire::SimTrainResult failed;
      failed.status = job.status().withContext("MPI rank " + std::to_string(session.rank()));
      result = std::move(failed);
    }
    FEDFLEET_RETURN_IF_ERROR(sendPolling(wire::encodeSimJobResult(result), 0, kResult));
  }
}

#endif  // FEDFLEET_HAVE_MPI

}  // namespace fedfleet::sim
