// The `fedfleet` command line: parses arguments with CLI11 and runs a subcommand.
#pragma once

#include <string>

namespace fedfleet::cli {

// Returns the process exit status: 0 on success, 1 on a runtime failure, 2 on bad usage or
// configuration (the message names the flag, key or file).
int main(int argc, char** argv);

// fedfleet's log on stderr at `level` (trace, debug, info, warn, error, off), as every command
// sets it up.
void setupLogging(const std::string& level);

}  // namespace fedfleet::cli
