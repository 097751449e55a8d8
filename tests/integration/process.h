// Test helper: start the `fedfleet` program (or any program) as a child process with its output
// in a log file; wait with a time limit; kill. Used by the multi-process tests.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace fedfleet::testing {

class Process {
 public:
  Process(std::vector<std::string> args, const std::string& log_path) : log_(log_path) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() {
    if (running()) {
      kill(SIGKILL);
      waitFor(10);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool started() const { return pid_ > 0; }
  // The child's process id (-1 if it did not start): its /proc entry while it runs.
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_code_; }
  void kill(int sig) {
    if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
  }
  // Waits up to `seconds`; returns the exit code (128 + signal if killed), or nullopt.
  std::optional<int> waitFor(double seconds) {
    if (exit_code_) return exit_code_;
    if (pid_ <= 0) return 127;
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (true) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      if (std::chrono::steady_clock::now() > until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Waits until the log contains `text`.
  bool waitForLog(const std::string& text, double seconds) const {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      if (log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  std::optional<int> exit_code_;
};

// A fresh directory under the test tmp dir.
inline std::string freshDir(const std::string& name) {
  std::string dir = std::string(FEDFLEET_TEST_TMP) + "/" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Reads a file written by `fedfleet coordinator --endpoint-file`, waiting for it to appear.
inline std::string waitForEndpoint(const std::string& path, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0); 0 when
// no socket could be bound. Another process may take it before the caller binds it.
inline int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

}  // namespace fedfleet::testing
