#include "cli/commands.h"

#include <malloc.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include "cli/history_command.h"
#include "cli/model_command.h"
#include "client/client_runtime.h"
#include "client/peer_runtime.h"
#include "common/compress/error_feedback.h"
#include "common/config/config.h"
#include "common/history/history.h"
#include "common/model/blas_core.h"
#include "common/transport/transport.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/peer_coordinator.h"
#include "driver/data_files.h"
#include "driver/resume.h"
#include "sim/fleet_simulator.h"
#include "sim/mpi_workers.h"
#include "sim/peer_simulator.h"

namespace fedfleet::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};  // SIGINT or SIGTERM, once one came
coordinator::CoordinatorService* g_coordinator = nullptr;
client::ClientRuntime* g_client = nullptr;
coordinator::PeerCoordinator* g_peer_coordinator = nullptr;
client::PeerRuntime* g_peer = nullptr;
sim::FleetSimulator* g_sim = nullptr;
sim::PeerSimulator* g_peer_sim = nullptr;

void onSignal(int sig) {
  g_stop.store(true);
  g_signal.store(sig);
  if (g_coordinator) g_coordinator->stop();
  if (g_client) g_client->stop();
  if (g_peer_coordinator) g_peer_coordinator->stop();
  if (g_peer) g_peer->stop();
  if (g_sim) g_sim->stop();
  if (g_peer_sim) g_peer_sim->stop();
}

// 128 + the signal after a clean stop on SIGINT (130) or SIGTERM (143), as shells report a
// program killed by it, so that a script can tell a stopped run from a finished one
// (docs/ERRORS.md); 0 when no signal came.
int signalExitCode() {
  const int sig = g_signal.load();
  return sig == 0 ? 0 : 128 + sig;
}

// SIGHUP: the coordinator re-reads its allow-list (others ignore it).
void onHangup(int) {
  if (g_coordinator) g_coordinator->reloadAllowList();
}

void installSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};
  hup.sa_handler = onHangup;
  sigemptyset(&hup.sa_mask);
  sigaction(SIGHUP, &hup, nullptr);
}

// Points the signal handler at `object` (it stops it on SIGINT/SIGTERM). A signal that came
// while it was being built (the handlers are installed before, so it is not lost) stops it at
// once.
template <typename T>
void track(T*& slot, T* object) {
  slot = object;
  if (g_stop.load()) object->stop();
}

// Builds a service or runtime with Runtime::create(options) and runs it under the signal handler
// (`slot`, see track). Exit code: 2 for options it refuses, the signal's code when one stopped
// it, else 0 on success and 1 on failure, each failure printed after "fedfleet `command`: ".
// `before_run` sees it built, `after_run` after a run that ended well (stopped by a signal too).
template <typename Runtime, typename Options>
int createAndRun(const char* command, const Options& options, Runtime*& slot,
                 const std::function<void(Runtime&)>& before_run = nullptr,
                 const std::function<void(Runtime&)>& after_run = nullptr) {
  auto created = Runtime::create(options);
  if (!created.isOk()) {
    std::cerr << "fedfleet " << command << ": " << created.status().toString() << "\n";
    return created.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  Runtime& runtime = **created;
  if (before_run) before_run(runtime);
  track(slot, &runtime);
  Status st = runtime.run();
  slot = nullptr;
  if (!st.isOk()) {
    std::cerr << "fedfleet " << command << ": " << st.toString() << "\n";
    return signalExitCode() ? signalExitCode() : 1;
  }
  if (after_run) after_run(runtime);
  return signalExitCode();
}

// The CURVE key pair of `name` and the coordinator's public key, from `keys_dir`; kNotFound
// saying what is missing and the keygen command that makes it.
Status readClientKeys(const std::string& keys_dir, const std::string& name,
                      transport::KeyPair* keys, std::string* server_key) {
  auto pair = transport::readKeyPair(keys_dir, name);
  if (!pair.isOk()) {
    return Status(pair.status().code(), pair.status().message() +
                                            " (create keys with `fedfleet keygen --dir " +
                                            keys_dir + " --name " + name + "`)");
  }
  auto server = transport::readPublicKeyFile(keys_dir + "/coordinator.key");
  if (!server.isOk()) {
    return Status(server.status().code(), "coordinator public key: " + server.status().message());
  }
  *keys = std::move(pair).value();
  *server_key = std::move(server).value();
  return Status::ok();
}

// readClientKeys, its error printed after "fedfleet `command`: "; false then.
bool readClientKeys(const char* command, const std::string& keys_dir, const std::string& name,
                    transport::KeyPair* keys, std::string* server_key) {
  Status st = readClientKeys(keys_dir, name, keys, server_key);
  if (!st.isOk()) std::cerr << "fedfleet " << command << ": " << st.message() << "\n";
  return st.isOk();
}

}  // namespace

void setupLogging(const std::string& level) {
  // One logger per process: main() runs more than once in the Python package's process.
  auto logger = spdlog::get("fedfleet");
  if (!logger) logger = spdlog::stderr_color_mt("fedfleet");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

namespace {

// Flags shared by coordinator and client: config file(s) and overrides.
struct ConfigFlags {
  std::vector<std::string> files;
  std::vector<std::string> sets;
  std::string log_level = "info";
};

void addConfigFlags(CLI::App* app, ConfigFlags& f) {
  app->add_option("-c,--config", f.files, "TOML config file (repeatable; later files win)")
      ->check(CLI::ExistingFile);
  app->add_option("--set", f.sets, "Override one key: section.key=value (repeatable)");
  app->add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
}

// Loads files, then the named flags (kept as "key=value" overrides), then --set overrides.
// With --resume (coordinator.resume), the run's stored configuration is the base they are
// applied to: a resume needs no flag of the first start again, and what it does give is a
// change that resume checks as usual (driver/resume.h).
Status buildConfig(const ConfigFlags& f, const std::vector<std::string>& flag_overrides,
                   config::Config& config) {
  auto apply = [&](config::Config& c) -> Status {
    for (const auto& file : f.files) FEDFLEET_RETURN_IF_ERROR(c.loadFile(file));
    for (const auto& s : flag_overrides) FEDFLEET_RETURN_IF_ERROR(c.set(s));
    for (const auto& s : f.sets) FEDFLEET_RETURN_IF_ERROR(c.set(s));
    return Status::ok();
  };
  FEDFLEET_RETURN_IF_ERROR(apply(config));
  std::error_code ec;
  if (config.coordinator.resume && std::filesystem::is_regular_file(config.history.db, ec)) {
    auto store = history::openSqliteHistoryReadOnly(config.history.db);
    if (!store.isOk()) return store.status().withContext("--resume");
    // The run named run.name; with no name given (the default), the file's latest run.
    auto stored = driver::latestRunConfig(**store, config.run.name);
    if (!stored.isOk() && stored.status().code() == StatusCode::kNotFound &&
        config.run.name == config::Config().run.name) {
      stored = driver::latestRunConfig(**store, "");
    }
    if (stored.isOk()) {
      config::Config base;
      FEDFLEET_RETURN_IF_ERROR(base.loadJson(*stored, config.history.db + " (its stored run)"));
      FEDFLEET_RETURN_IF_ERROR(apply(base));
      config = std::move(base);
    } else if (stored.status().code() != StatusCode::kNotFound) {
      return stored.status().withContext("--resume");
    }  // no such run: resume itself says so
  }
  return config.validate();
}

// A TOML string literal holding `v`.
std::string quoteToml(const std::string& v) {
  std::string q = "\"";
  for (char ch : v) {
    if (ch == '"' || ch == '\\') q.push_back('\\');
    q.push_back(ch);
  }
  return q + "\"";
}

// Registers `--name VALUE` as an override of `key`.
template <typename T>
void addOverride(CLI::App* app, std::vector<std::string>& overrides, const std::string& flag,
                 const std::string& key, const std::string& help) {
  app->add_option_function<T>(
      flag,
      [&overrides, key](const T& v) {
        if constexpr (std::is_same_v<T, std::string>) {
          overrides.push_back(key + "=" + quoteToml(v));
        } else {
          overrides.push_back(key + "=" + std::to_string(v));
        }
      },
      help + " (" + key + ")");
}

// --model NAME picks a built-in model; --model FILE.pt picks a TorchScript module.
void addModelFlag(CLI::App* app, std::vector<std::string>& overrides) {
  app->add_option_function<std::string>(
      "--model",
      [&overrides](const std::string& v) {
        const bool is_file =
            v.size() > 3 && (v.ends_with(".pt") || v.find('/') != std::string::npos);
        if (is_file) {
          overrides.push_back("model.name=\"torchscript\"");
          overrides.push_back("model.path=" + quoteToml(v));
        } else {
          overrides.push_back("model.name=" + quoteToml(v));
        }
      },
      "Built-in model (logreg, mlp, cnn, lenet) or a TorchScript file (*.pt) (model.name, "
      "model.path)");
}

void addFlagOverride(CLI::App* app, std::vector<std::string>& overrides, const std::string& flag,
                     const std::string& key, const std::string& help) {
  app->add_flag_callback(
      flag, [&overrides, key] { overrides.push_back(key + "=true"); }, help + " (" + key + ")");
}

// Writes `endpoint` to `path` (when set) after binding, atomically, so that a script that waits
// for the file can connect at once.
void writeEndpointFile(const std::string& path, const std::string& endpoint) {
  if (path.empty() || endpoint.empty()) return;
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << endpoint << "\n";
  std::filesystem::rename(tmp, path);
}

// Runs coordinator `Service` of `config`: its endpoint written to `endpoint_file` once bound
// (a script that waits for the file can connect at once), and where the history went at the end.
template <typename Service>
int runService(const config::Config& config, const std::string& endpoint_file, Service*& slot) {
  return createAndRun<Service>(
      "coordinator", config, slot,
      [&](Service& service) { writeEndpointFile(endpoint_file, service.boundEndpoint()); },
      [&](Service& service) {
        std::cout << "history: " << std::filesystem::absolute(config.history.db).string()
                  << " (run " << service.runId() << ")\n";
      });
}

// `fedfleet coordinator` with policy.mode = "decentralized": the peers' rendezvous, Prague's
// group generator and the history (coordinator/peer_coordinator.h).
int runPeerCoordinator(const config::Config& config, const std::string& endpoint_file) {
  return runService<coordinator::PeerCoordinator>(config, endpoint_file, g_peer_coordinator);
}

// `fedfleet peer`: one peer of a decentralised run (client/peer_runtime.h).
int runPeer(const ConfigFlags& f, const std::vector<std::string>& overrides, uint32_t index,
            const std::string& listen, const std::string& allow_dir, bool insecure_flag) {
  config::Config config;
  Status st = buildConfig(f, overrides, config);
  if (!st.isOk()) {
    std::cerr << "fedfleet peer: " << st.message() << "\n";
    return 2;
  }
  const auto& cc = config.client;
  client::PeerRuntimeOptions o;
  o.index = index;
  o.config = config;
  o.device = cc.device;
  o.threads = cc.threads;
  o.coordinator.endpoint = cc.coordinator;
  o.mesh.listen_endpoint = listen;
  // The peers watch each other with coordinator.liveness_s, beating six times per period.
  o.mesh.heartbeat_timeout_ms = static_cast<int>(config.coordinator.liveness_s * 1000);
  o.mesh.heartbeat_interval_ms = std::max(1, o.mesh.heartbeat_timeout_ms / 6);
  o.coordinator_silence_s = std::max(30.0, 5 * config.coordinator.liveness_s);
  o.register_timeout_s = config.coordinator.wait_clients_s;
  const std::string name = "peer-" + std::to_string(index);
  const bool insecure = insecure_flag || config.coordinator.insecure;
  o.coordinator.insecure = o.mesh.insecure = insecure;
  if (insecure) {
    spdlog::warn("--insecure: this peer talks to the coordinator and its peers in plain text");
    o.coordinator.routing_id = name;  // all an insecure coordinator has to know it by
  } else {
    // The peer's mesh is a CURVE server under this key: its path is checked as the
    // coordinator's is (a missing file is reported by readKeyPair below, with the fix).
    if (Status path = transport::checkSecretKeyFile(cc.keys_dir + "/" + name + ".key_secret");
        !path.isOk() && path.code() != StatusCode::kNotFound) {
      std::cerr << "fedfleet peer: " << path.message() << "\n";
      return 2;
    }
    if (!readClientKeys("peer", cc.keys_dir, name, &o.coordinator.client_keys,
                        &o.coordinator.server_public_key)) {
      return 2;
    }
    o.mesh.keys = o.coordinator.client_keys;
    o.mesh.allow_dir = allow_dir.empty() ? cc.keys_dir + "/clients" : allow_dir;
  }
  return createAndRun<client::PeerRuntime>("peer", o, g_peer);
}

int runCoordinator(const ConfigFlags& f, const std::vector<std::string>& overrides,
                   const std::string& endpoint_file) {
  config::Config config;
  Status st = buildConfig(f, overrides, config);
  if (!st.isOk()) {
    std::cerr << "fedfleet coordinator: " << st.message() << "\n";
    return 2;
  }
  if (config.coordinator.insecure) {
    spdlog::warn(
        "--insecure: the coordinator accepts plain-text connections from anyone; "
        "traffic and models are not encrypted");
  }
  if (config.policy.mode == config::PolicyMode::kDecentralized)
    return runPeerCoordinator(config, endpoint_file);
  return runService<coordinator::CoordinatorService>(config, endpoint_file, g_coordinator);
}

// Runs a simulator to its end (`running` points at it meanwhile, for the signal handler): its
// summary and where the history went on stdout, or the error (exit 2 for a bad config, else 1).
template <typename Simulator, typename Format>
int runSimulator(Result<std::unique_ptr<Simulator>> sim, Simulator*& running,
                 const config::Config& config, Format format) {
  if (!sim.isOk()) {
    // A bad config, or a file it names that is not there: a usage error (2).
    std::cerr << "fedfleet sim: " << sim.status().toString() << "\n";
    const StatusCode code = sim.status().code();
    return code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound ? 2 : 1;
  }
  track(running, sim->get());
  auto summary = (*sim)->run();
  running = nullptr;
  if (!summary.isOk()) {
    std::cerr << "fedfleet sim: " << summary.status().toString() << "\n";
    return signalExitCode() ? signalExitCode() : 1;
  }
  std::cout << format(*summary);
  if (config.history.db != ":memory:") {
    std::cout << "history: " << std::filesystem::absolute(config.history.db).string() << " (run "
              << summary->run_id << ")\n";
  }
  return 0;
}

// policy.mode = "decentralized": the peers of sim/peer_simulator.h, in this process.
int runPeerSim(const config::Config& config, bool mpi) {
  if (mpi) {
    std::cerr << "fedfleet sim: a decentralised simulation runs in one process (sim.workers "
                 "threads); start it without mpirun\n";
    return 2;
  }
  return runSimulator(sim::PeerSimulator::create(config), g_peer_sim, config,
                      [](const sim::PeerSimSummary& s) { return sim::formatPeerSummary(s); });
}

// The simulator allocates and frees blocks of hundreds of KiB to tens of MiB every round (model
// copies, the virtual clients' deltas and masked payloads, LibTorch's buffers). glibc serves
// blocks above its mmap threshold from fresh pages and trims freed memory off the heap's top,
// so a round faults its buffers in again, 4 KiB at a time (a fifth of a SecAgg+ round's host
// time with 100 clients, docs/BENCHMARKS.md). Setting either threshold turns off glibc's own
// raising of the mmap threshold (from 128 KiB up to 32 MiB as large blocks are freed), so both
// are set, above it: blocks up to 64 MiB come from the heap (with 4 MiB, a CNN round's
// convolution buffers were mapped afresh every step, and took 2.5 times as long) and up to
// 512 MiB of free heap is kept. Larger blocks (the tables of a large fleet) are still mapped
// and unmapped whole.
void keepRoundBuffersInTheHeap() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

int runSim(const ConfigFlags& f, const std::vector<std::string>& overrides) {
  keepRoundBuffersInTheHeap();
  // Started by mpirun / srun as one of several ranks: rank 0 runs the simulation with the
  // others as its workers (sim/mpi_workers.h); only rank 0 prints.
  std::unique_ptr<sim::MpiSession> mpi;
  if (sim::launchedAsMpiJob()) {
    auto session = sim::MpiSession::start();
    if (!session.isOk()) {
      std::cerr << "fedfleet sim: " << session.status().message() << "\n";
      return 2;
    }
    mpi = std::move(*session);
  }
  const bool rank0 = !mpi || mpi->rank() == 0;
  config::Config config;
  Status st = buildConfig(f, overrides, config);
  if (!st.isOk()) {
    if (rank0) std::cerr << "fedfleet sim: " << st.message() << "\n";
    return 2;
  }
  installSignalHandlers();
  if (config.policy.mode == config::PolicyMode::kDecentralized)
    return runPeerSim(config, mpi != nullptr);
  std::shared_ptr<sim::RemoteWorkers> remote;
  if (mpi && mpi->rank() != 0) {
    st = sim::runMpiWorker(*mpi, config);
    if (!st.isOk()) {
      std::cerr << "fedfleet sim (MPI rank " << mpi->rank() << "): " << st.toString() << "\n";
      return 1;
    }
    return 0;
  }
  if (mpi) {
    auto workers = sim::connectMpiWorkers(*mpi, &g_stop);
    if (!workers.isOk()) {
      std::cerr << "fedfleet sim: " << workers.status().message() << "\n";
      return 1;
    }
    remote = std::move(*workers);
  }
  auto simulator = sim::FleetSimulator::create(config, {remote, nullptr, nullptr});
  if (simulator.isOk() && !(*simulator)->alreadyFinished().empty()) {
    // Nothing to resume: said plainly, and not an error (as the coordinator does).
    std::cout << (*simulator)->alreadyFinished() << "\n";
    return 0;
  }
  return runSimulator(std::move(simulator), g_sim, config,
                      [](const sim::SimSummary& s) { return sim::formatSummary(s); });
}

}  // namespace

Result<client::ClientRuntimeOptions> clientRuntimeOptions(const config::Config& config,
                                                          bool insecure_flag, bool read_data) {
  if (config.dataFormat() == data::DataFormat::kSynthetic && read_data) {
    return invalidArgument(
        "data.format = \"synthetic\" is generated per device by the simulator (fedfleet sim); "
        "a client process trains fashion-mnist or its own files");
  }
  const auto& cc = config.client;
  client::ClientRuntimeOptions o;
  if (read_data && config.readsDataFiles()) {
    // This client's own files: it trains all of them (data.partition = "none").
    auto own = driver::loadOwnData(config);
    if (!own.isOk()) return Status(own.status().code(), own.status().toString());
    spdlog::info("client: {} samples of its own ({} {}), {} held out for federated evaluation",
                 own->train.size(), config.dataFormatName(), config.data.path, own->test.size());
    o.own_data = std::make_shared<const data::Dataset>(std::move(own->train));
    o.own_test = std::make_shared<const data::Dataset>(std::move(own->test));
    o.own_format = config.dataFormatName();
  }
  o.client_id = cc.id.empty() ? "client-" + std::to_string(getpid()) : cc.id;
  o.device = cc.device;
  o.data_dir = config.data.dir;
  o.torchscript_path = config.model.path;
  o.threads = cc.threads;
  o.partition = static_cast<int32_t>(cc.partition);
  o.heartbeat_s = cc.heartbeat_s;
  o.liveness_s = std::max(5.0, 5 * cc.heartbeat_s);
  o.exit_idle_s = cc.exit_idle_s;
  o.upload_mbps = cc.upload_mbps;
  o.upload_burst_bytes = size_t{cc.upload_burst_kib} * 1024;
  o.upload_pipelined = cc.upload_pipelined;
  o.compress_on_gpu = cc.compress_on_gpu;
  o.residual_storage = compress::parseResidualStorage(cc.residual_storage).value();
  o.scaffold_state_path = cc.scaffold_state;
  o.local_patterns = config.model.local;
  o.local_state_path = cc.local_state;
  o.scaffold_storage = compress::parseResidualStorage(cc.scaffold_storage).value();
  o.served_model_path = cc.served_model_path;
  o.local_dp_min_noise = cc.local_dp_min_noise;
  o.transport.endpoint = cc.coordinator;
  // No routing id: ZeroMQ gives the connection one. The coordinator knows this client by its
  // key, never by a routing id it could choose.
  // The client loop must keep beating while the coordinator is away: give up on a send soon.
  o.transport.send_timeout_ms = 1000;
  o.transport.insecure = insecure_flag || config.coordinator.insecure;
  if (o.transport.insecure) {
    spdlog::warn("--insecure: this client talks to the coordinator in plain text");
  } else {
    Status keys = readClientKeys(cc.keys_dir, o.client_id, &o.transport.client_keys,
                                 &o.transport.server_public_key);
    // The command exits 2 for it: a usage error, as a missing config file is.
    if (!keys.isOk()) return invalidArgument(keys.message());
  }
  return o;
}

namespace {

int runClient(const ConfigFlags& f, const std::vector<std::string>& overrides, bool insecure_flag) {
  config::Config config;
  Status st = buildConfig(f, overrides, config);
  if (!st.isOk()) {
    std::cerr << "fedfleet client: " << st.message() << "\n";
    return 2;
  }
  auto o = clientRuntimeOptions(config, insecure_flag, /*read_data=*/true);
  if (!o.isOk()) {
    std::cerr << "fedfleet client: " << o.status().message() << "\n";
    return o.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  return createAndRun<client::ClientRuntime>("client", *o, g_client);
}

int runKeygen(const std::string& dir, std::vector<std::string> names, uint32_t clients,
              const std::string& prefix, bool coordinator, bool force) {
  for (uint32_t i = 1; i <= clients; ++i) names.push_back(prefix + std::to_string(i));
  if (coordinator) names.insert(names.begin(), "coordinator");
  if (names.empty()) {
    std::cerr << "fedfleet keygen: nothing to do: give --coordinator, --name or --clients\n";
    return 2;
  }
  for (const auto& name : names) {
    auto keys = transport::generateKeyPair();
    if (!keys.isOk()) {
      std::cerr << "fedfleet keygen: " << keys.status().toString() << "\n";
      return 1;
    }
    Status st = transport::writeKeyPair(dir, name, *keys, force);
    if (st.isOk() && name != "coordinator") {
      // The public key file also goes into the coordinator's allow-list directory.
      std::error_code ec;
      const std::string allow_dir = dir + "/clients";
      if (!std::filesystem::exists(allow_dir, ec)) {
        // 0700 whatever the umask: whoever may add a file here may admit a key.
        std::filesystem::create_directories(allow_dir, ec);
        if (!ec) {
          std::filesystem::permissions(allow_dir, std::filesystem::perms::owner_all,
                                       std::filesystem::perm_options::replace, ec);
        }
      }
      if (!ec) {
        std::filesystem::copy_file(dir + "/" + name + ".key", dir + "/clients/" + name + ".key",
                                   force ? std::filesystem::copy_options::overwrite_existing
                                         : std::filesystem::copy_options::none,
                                   ec);
      }
      if (ec) st = ioError("allow-list copy of " + name + ".key: " + ec.message());
    }
    if (!st.isOk()) {
      std::cerr << "fedfleet keygen: " << st.toString() << "\n";
      return 1;
    }
    std::cout << dir << "/" << name << ".key\n";
  }
  return 0;
}

}  // namespace

void runAgainWithBetterBlas(int argc, char** argv) {
  // The subcommands that train or evaluate models; the rest read files or write keys.
  const std::string sub = argc >= 2 ? argv[1] : "";
  if (sub != "sim" && sub != "coordinator" && sub != "client" && sub != "peer") return;
  // OPENBLAS_CORETYPE is read only when OpenBLAS loads, before main: set it and start again.
  // At most once, as the new process finds it set; set it yourself to keep any choice.
  const auto better = model::blasCoreToAsk();
  if (!better) return;
  ::setenv("OPENBLAS_CORETYPE", better->c_str(), 1);
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OPENBLAS_CORETYPE");
  spdlog::warn(
      "could not run again with OPENBLAS_CORETYPE={} ({}): fp32 products stay on "
      "OpenBLAS's {} kernels; set OPENBLAS_CORETYPE={} before starting fedfleet",
      *better, std::strerror(errno), model::openblasCoreName(), *better);
}

int main(int argc, char** argv) {
  CLI::App app{"fedfleet: federated training on heterogeneous fleets"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fedfleet 0.1.0");
  app.add_flag_callback(
      "--blas-core",
      [] {
        std::cout << model::fedfleetBlasCore() << "\n";
        std::exit(0);
      },
      "Print the OpenBLAS kernels the training subcommands' fp32 products run on (empty "
      "without OpenBLAS), and exit");

  // coordinator
  ConfigFlags coord_flags;
  std::vector<std::string> coord_overrides;
  auto* coord =
      app.add_subcommand("coordinator", "Run a coordinator: sample clients, aggregate, record");
  addConfigFlags(coord, coord_flags);
  addOverride<std::string>(coord, coord_overrides, "--bind", "coordinator.bind", "Bind address");
  addOverride<std::string>(coord, coord_overrides, "--keys", "coordinator.keys_dir",
                           "Key directory");
  addOverride<std::string>(coord, coord_overrides, "--allow", "coordinator.allow_dir",
                           "Allowed client keys");
  addOverride<std::string>(coord, coord_overrides, "--db", "history.db", "SQLite history file");
  addModelFlag(coord, coord_overrides);
  addOverride<std::string>(coord, coord_overrides, "--model-path", "model.path",
                           "TorchScript file");
  addOverride<std::string>(coord, coord_overrides, "--data-dir", "data.dir",
                           "Fashion-MNIST directory");
  addOverride<std::string>(coord, coord_overrides, "--name", "run.name", "Run name");
  addOverride<int64_t>(coord, coord_overrides, "--rounds", "run.rounds", "Rounds");
  addOverride<int64_t>(coord, coord_overrides, "--seed", "run.seed", "Seed");
  addOverride<int64_t>(coord, coord_overrides, "--clients-per-round",
                       "coordinator.clients_per_round", "K");
  addOverride<int64_t>(coord, coord_overrides, "--min-clients", "coordinator.min_clients",
                       "Clients needed to start");
  addOverride<double>(coord, coord_overrides, "--deadline", "coordinator.deadline_s",
                      "Round deadline, seconds");
  addFlagOverride(coord, coord_overrides, "--insecure", "coordinator.insecure",
                  "Plain text, no CURVE");
  std::string endpoint_file;
  coord->add_option("--endpoint-file", endpoint_file,
                    "Write the bound endpoint (with the port actually chosen) to this file");
  addFlagOverride(coord, coord_overrides, "--resume", "coordinator.resume",
                  "Resume the latest run of this name");
  addFlagOverride(coord, coord_overrides, "--resume-changes", "coordinator.resume_changes",
                  "With --resume: accept a config that changes the run (more rounds, another K, "
                  "...); the changes are recorded as a resume_changes event");
  addOverride<int64_t>(coord, coord_overrides, "--metrics-port", "metrics.port",
                       "Serve /metrics and /status on this port (0: off)");

  // client
  ConfigFlags client_flags;
  std::vector<std::string> client_overrides;
  bool client_insecure = false;
  auto* cl = app.add_subcommand("client", "Run a client: train the tasks a coordinator sends");
  addConfigFlags(cl, client_flags);
  addOverride<std::string>(cl, client_overrides, "--coordinator", "client.coordinator",
                           "Coordinator address");
  addOverride<std::string>(cl, client_overrides, "--id", "client.id",
                           "Client id (also its key name)");
  addOverride<std::string>(cl, client_overrides, "--keys", "client.keys_dir", "Key directory");
  addOverride<std::string>(cl, client_overrides, "--device", "client.device", "auto, cpu or cuda");
  addOverride<std::string>(cl, client_overrides, "--data-dir", "data.dir",
                           "Fashion-MNIST directory");
  addOverride<std::string>(cl, client_overrides, "--model-path", "model.path", "TorchScript file");
  addModelFlag(cl, client_overrides);
  addOverride<int64_t>(cl, client_overrides, "--threads", "client.threads", "LibTorch threads");
  addOverride<int64_t>(cl, client_overrides, "--partition", "client.partition",
                       "Ask for this partition");
  addOverride<double>(cl, client_overrides, "--exit-idle", "client.exit_idle_s",
                      "Exit after this much coordinator silence");
  cl->add_flag("--insecure", client_insecure, "Plain text, no CURVE");

  // peer
  ConfigFlags peer_flags;
  std::vector<std::string> peer_overrides;
  bool peer_insecure = false;
  uint32_t peer_index = 0;
  std::string peer_listen = "tcp://127.0.0.1:0";
  std::string peer_allow;
  auto* peerc = app.add_subcommand(
      "peer", "Run one peer of a decentralised run (policy.mode = \"decentralized\")");
  addConfigFlags(peerc, peer_flags);
  peerc->add_option("--id", peer_index, "Peer index 0 .. decentralized.peers - 1 (key peer-N)")
      ->required();
  addOverride<std::string>(peerc, peer_overrides, "--coordinator", "client.coordinator",
                           "Coordinator address");
  addOverride<std::string>(peerc, peer_overrides, "--keys", "client.keys_dir",
                           "Key directory (peer-N.key, peer-N.key_secret, coordinator.key)");
  peerc->add_option("--allow", peer_allow, "Allowed peer public keys (default: <keys>/clients)");
  peerc->add_option("--listen", peer_listen,
                    "Where this peer's mesh listens (the address other peers dial)");
  addOverride<std::string>(peerc, peer_overrides, "--data-dir", "data.dir",
                           "Fashion-MNIST directory");
  addOverride<int64_t>(peerc, peer_overrides, "--threads", "client.threads", "LibTorch threads");
  peerc->add_flag("--insecure", peer_insecure, "Plain text, no CURVE");

  // sim
  ConfigFlags sim_flags;
  std::vector<std::string> sim_overrides;
  auto* simc = app.add_subcommand(
      "sim", "Simulate a fleet on this host: the coordinator's rounds over virtual clients");
  addConfigFlags(simc, sim_flags);
  addOverride<std::string>(simc, sim_overrides, "--db", "history.db",
                           "SQLite history file (:memory: for none)");
  addModelFlag(simc, sim_overrides);
  addOverride<std::string>(simc, sim_overrides, "--model-path", "model.path",
                           "TorchScript file (with --model torchscript)");
  addOverride<std::string>(simc, sim_overrides, "--data-dir", "data.dir",
                           "Fashion-MNIST directory");
  addOverride<std::string>(simc, sim_overrides, "--name", "run.name", "Run name");
  addOverride<int64_t>(simc, sim_overrides, "--rounds", "run.rounds", "Rounds");
  addOverride<int64_t>(simc, sim_overrides, "--seed", "run.seed", "Seed");
  addOverride<int64_t>(simc, sim_overrides, "--clients", "sim.clients", "Registered clients");
  addOverride<int64_t>(simc, sim_overrides, "--clients-per-round", "coordinator.clients_per_round",
                       "K");
  addOverride<std::string>(simc, sim_overrides, "--fleet", "sim.fleet",
                           "uniform, mobile-mix or a CSV file");
  addOverride<int64_t>(simc, sim_overrides, "--workers", "sim.workers",
                       "Training threads (0: one per core)");
  addOverride<std::string>(simc, sim_overrides, "--progress", "sim.progress", "auto, on or off");
  addFlagOverride(simc, sim_overrides, "--resume", "coordinator.resume",
                  "Continue the interrupted run of this name in --db: its recorded rounds are "
                  "replayed (and checked against the file), then the run goes on");

  // keygen
  std::string key_dir = "keys";
  std::vector<std::string> key_names;
  uint32_t key_clients = 0;
  std::string key_prefix = "client-";
  bool key_coordinator = false, key_force = false;
  auto* kg = app.add_subcommand("keygen", "Write CURVE key pairs (secret files mode 0600)");
  kg->add_option("--dir", key_dir, "Key directory (client public keys also go to DIR/clients/)");
  kg->add_flag("--coordinator", key_coordinator, "Write the coordinator's key pair");
  kg->add_option("--name", key_names, "Write a client key pair of this name (repeatable)");
  kg->add_option("--clients", key_clients, "Write N client key pairs named PREFIX1..PREFIXN");
  kg->add_option("--prefix", key_prefix, "Client name prefix for --clients");
  kg->add_flag("--force", key_force, "Overwrite existing key files");

  // history: `fedfleet history [runs|rounds|clients|updates|tiers|events|blocks|served|peers|
  // peer-evals]`;
  // rounds without a subcommand. The options may come before or after the subcommand.
  HistoryArgs hist_args;
  std::string hist_level = "warn";
  auto* hist = app.add_subcommand(
      "history",
      "Print the history: runs, rounds (default), clients, updates, tiers, events, blocks, "
      "served, peers, peer-evals. Tables show a simulated (virtual-clock) run's times as "
      "seconds from its start (t=64.00 s), a real run's as UTC dates; CSV and JSON give the "
      "stored numbers");
  hist->add_option("--db", hist_args.db, "SQLite history file");
  hist->add_option("--format", hist_args.format, "table, csv or json");
  hist->add_option("--run", hist_args.run,
                   "Run id (rounds, updates, tiers, blocks, served, peers, peer-evals: default "
                   "the latest; runs, "
                   "clients, events: all)");
  hist->require_subcommand(0, 1);
  const std::pair<const char*, const char*> kHistoryViews[] = {
      {"runs", "The runs: id, name, start, seed, clock (CSV/JSON: with the configuration)"},
      {"rounds", "The rounds of a run"},
      {"clients",
       "The clients (with --run: those that took part in the run). The table is shared by all "
       "runs: a first/last_seen before 2001 is a simulated run's time, shown as t=SECONDS"},
      {"updates", "The client updates of a run (--round N: of one round)"},
      {"tiers",
       "Completed, late, dropped and rejected updates of a run per fleet tier (a simulated "
       "run's tier is the client's device name; a real run groups by the reported device)"},
      {"events",
       "Recorded events (rejections, refusals, drops, ...), each time on its run's clock (no "
       "run: wall clock)"},
      {"blocks",
       "Per-block accuracy of a block-cyclic run (model: shared, pluralistic, chain, "
       "served)"},
      {"served",
       "Block-cyclic runs: the model each client serves now (block, model, version) and its "
       "accuracy on the client's held-out data"},
      {"peers",
       "Decentralised runs: per peer, iterations, exchanges, bytes, compute, communication and "
       "waiting seconds, staleness"},
      {"peer-evals", "Decentralised runs: the test accuracy and loss of the peers' average model"},
  };
  std::vector<CLI::App*> hist_views;
  for (const auto& [name, help] : kHistoryViews) {
    auto* view = hist->add_subcommand(name, help);
    view->fallthrough();
    if (std::string(name) == "updates") {
      view->add_option_function<uint32_t>(
          "--round", [&hist_args](const uint32_t& r) { hist_args.round = r; }, "Only this round");
    }
    hist_views.push_back(view);
  }

  // report
  ReportArgs report_args;
  auto* report = app.add_subcommand(
      "report", "Write a self-contained HTML report (charts, stragglers, config) of a history");
  report->add_option("--db", report_args.db, "SQLite history file");
  report->add_option("-o,--output", report_args.output, "HTML file to write");
  report->add_option("--run", report_args.runs, "Run id to show (repeatable; default: every run)");
  report->add_option_function<uint32_t>(
      "--timeline-round", [&report_args](const uint32_t& r) { report_args.timeline_round = r; },
      "Round of the per-client timeline (default: the one with the worst stragglers)");

  // model: `fedfleet model info|export`, a run's model out of its history.
  ModelArgs model_args;
  auto* modelc = app.add_subcommand(
      "model",
      "A run's trained model: its layout and checkpoints (info), or a file PyTorch loads "
      "(export)");
  modelc->require_subcommand(1);
  auto* model_info = modelc->add_subcommand(
      "info",
      "The run's model: name, input, classes, checkpoints (the best marked) and each "
      "tensor's name, shape and offset in the flat buffer");
  auto* model_export = modelc->add_subcommand(
      "export",
      "Write a checkpoint as a model file: a TorchScript model as the trained module "
      "(torch.jit.load), a built-in one as a state_dict (torch.load; keys as in "
      "examples/models/fedfleet_models.py), or --format flat (raw float32 and FILE.json)");
  for (auto* sub : {model_info, model_export}) {
    sub->add_option("--db", model_args.db, "SQLite history file");
    sub->add_option("--run", model_args.run, "Run id (default: the latest)");
  }
  model_info->add_flag("--json", model_args.json, "Print the model's description as JSON");
  auto* round_opt = model_export->add_option_function<uint32_t>(
      "--round", [&model_args](const uint32_t& r) { model_args.round = r; },
      "The checkpoint of this round");
  auto* best_opt = model_export->add_flag(
      "--best", model_args.best,
      "The checkpoint of the best test accuracy (coordinator.keep_best keeps it)");
  bool export_last = false;
  auto* last_opt =
      model_export->add_flag("--last", export_last, "The latest checkpoint (the default)");
  round_opt->excludes(best_opt)->excludes(last_opt);
  best_opt->excludes(last_opt);
  model_export->add_option("-o,--output", model_args.output, "File to write")->required();
  model_export->add_option("--format", model_args.format,
                           "auto (TorchScript module or state_dict), torchscript, state_dict, "
                           "flat");
  model_export->add_option("--module", model_args.module,
                           "The TorchScript file to fill (default: the one the run loaded)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // The long-running commands take SIGINT and SIGTERM from the start: a signal during start-up
  // (loading data, building the model) stops the run as soon as it exists, and is not lost (a
  // shell's background job otherwise ignores SIGINT until a handler is installed).
  if (coord->parsed() || simc->parsed() || cl->parsed() || peerc->parsed()) {
    installSignalHandlers();
  }
  if (coord->parsed()) {
    setupLogging(coord_flags.log_level);
    return runCoordinator(coord_flags, coord_overrides, endpoint_file);
  }
  if (simc->parsed()) {
    setupLogging(sim_flags.log_level);
    return runSim(sim_flags, sim_overrides);
  }
  if (cl->parsed()) {
    setupLogging(client_flags.log_level);
    return runClient(client_flags, client_overrides, client_insecure);
  }
  if (peerc->parsed()) {
    setupLogging(peer_flags.log_level);
    return runPeer(peer_flags, peer_overrides, peer_index, peer_listen, peer_allow, peer_insecure);
  }
  setupLogging(hist_level);
  if (kg->parsed()) {
    return runKeygen(key_dir, key_names, key_clients, key_prefix, key_coordinator, key_force);
  }
  if (hist->parsed()) {
    for (auto* view : hist_views) {
      if (view->parsed()) hist_args.what = view->get_name();
    }
    return runHistoryCommand(hist_args);
  }
  if (report->parsed()) return runReportCommand(report_args);
  if (modelc->parsed()) {
    model_args.what = model_export->parsed() ? "export" : "info";
    return runModelCommand(model_args);
  }
  return 2;
}

}  // namespace fedfleet::cli
