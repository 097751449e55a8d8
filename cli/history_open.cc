#include "cli/history_open.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace fedfleet::cli {

std::unique_ptr<history::HistoryStore> openExisting(const std::string& db, const char* command,
                                                    int* exit_code) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(db, ec)) {
    std::cerr << "fedfleet " << command << ": " << db << ": no such file\n";
    *exit_code = 2;
    return nullptr;
  }
  auto store = history::openSqliteHistoryReadOnly(db);
  if (!store.isOk()) {
    std::cerr << "fedfleet " << command << ": " << store.status().toString() << "\n";
    *exit_code = 1;
    return nullptr;
  }
  return std::move(store).value();
}

std::optional<std::string> unwritableReason(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(status)) return "directory " + dir.string() + " does not exist";
  if (!std::filesystem::is_directory(status)) return dir.string() + " is not a directory";
  if (::access(dir.c_str(), W_OK) != 0) {
    return "directory " + dir.string() + " is not writable (" + std::strerror(errno) + ")";
  }
  return std::nullopt;
}

bool knownRun(const std::vector<history::RunRecord>& runs, int64_t run, const std::string& db,
              const char* command) {
  if (std::any_of(runs.begin(), runs.end(),
                  [run](const history::RunRecord& r) { return r.run_id == run; })) {
    return true;
  }
  std::cerr << "fedfleet " << command << ": " << db << " has no run " << run;
  if (!runs.empty()) {
    std::cerr << " (runs " << runs.front().run_id << ".." << runs.back().run_id << ")";
  }
  std::cerr << "\n";
  return false;
}

}  // namespace fedfleet::cli
