// fedfleet: the one program. Subcommands: coordinator, client, sim, keygen, history, report.
#include "cli/commands.h"

int main(int argc, char** argv) {
  fedfleet::cli::runAgainWithBetterBlas(argc, argv);
  return fedfleet::cli::main(argc, argv);
}
