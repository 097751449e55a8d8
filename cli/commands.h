// The `fedfleet` command line: parses arguments with CLI11 and runs a subcommand.
#pragma once

namespace fedfleet::cli {

// Returns the process exit status: 0 on success, 1 on a runtime failure, 2 on bad usage or
// configuration (the message names the flag, key or file).
int main(int argc, char** argv);

}  // namespace fedfleet::cli
