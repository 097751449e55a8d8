// What the commands that read a history (`fedfleet history`, `report`, `model`) share: opening
// the file read-only, checking a run id and an output path, and printing a failed Result. Each
// prints the problem to stderr as "fedfleet COMMAND: ..." and says which exit status follows.
#pragma once

#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::cli {

// Opens an existing history read-only (nothing is written, and no -wal or -shm file is left
// beside it). Prints the problem and returns the exit status in `exit_code` on failure: 2 for a
// missing file, 1 for one that is not a fedfleet history.
std::unique_ptr<history::HistoryStore> openExisting(const std::string& db, const char* command,
                                                    int* exit_code);

// Why a file cannot be written at `path`: its directory does not exist, is not a directory or
// may not be written by this user; std::nullopt when it looks writable.
std::optional<std::string> unwritableReason(const std::string& path);

// Checks `run` is in `runs`; prints the problem otherwise.
bool knownRun(const std::vector<history::RunRecord>& runs, int64_t run, const std::string& db,
              const char* command);

// Prints `r`'s error and returns true when it failed.
template <typename T>
bool failed(const Result<T>& r, const char* command) {
  if (r.isOk()) return false;
  std::cerr << "fedfleet " << command << ": " << r.status().toString() << "\n";
  return true;
}

}  // namespace fedfleet::cli
