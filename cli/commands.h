// The `fedfleet` command line: parses arguments with CLI11 and runs a subcommand.
#pragma once

#include <string>

#include "client/client_runtime.h"
#include "common/config/config.h"
#include "common/status.h"

namespace fedfleet::cli {

// Returns the process exit status: 0 on success, 1 on a runtime failure, 2 on bad usage or
// configuration (the message names the flag, key or file).
int main(int argc, char** argv);

// For the fedfleet program only, before main: where OpenBLAS took this CPU for one without AVX2
// (model::betterBlasCore) and the subcommand trains or evaluates models (sim, coordinator,
// client, peer), replaces this process with the same program and arguments, OPENBLAS_CORETYPE
// naming the kernels the CPU can run. Returns when there is nothing to do, or the exec failed
// (logged). Never from a process that embeds fedfleet (the Python package).
void runAgainWithBetterBlas(int argc, char** argv);

// What `fedfleet client` runs with: the runtime's options from `config` (its own data files read
// when `read_data` and the config names them; its CURVE keys from client.keys_dir unless
// insecure). kInvalidArgument for what the command exits 2 for (the message says what to do),
// the data loader's code otherwise.
Result<client::ClientRuntimeOptions> clientRuntimeOptions(const config::Config& config,
                                                          bool insecure, bool read_data);

// fedfleet's log on stderr at `level` (trace, debug, info, warn, error, off), as every command
// sets it up.
void setupLogging(const std::string& level);

}  // namespace fedfleet::cli
