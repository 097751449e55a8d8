#include "common/transport/descriptor_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

namespace fedfleet::transport {
namespace {

uint64_t fromRlim(rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(v); }

}  // namespace

DescriptorLimit descriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return {};
  return {fromRlim(rl.rlim_cur), fromRlim(rl.rlim_max)};
}

Result<DescriptorLimitChange> raiseDescriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return internalError(std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
  }
  DescriptorLimitChange change;
  change.before = {fromRlim(rl.rlim_cur), fromRlim(rl.rlim_max)};
  rlim_t target = rl.rlim_max;
  if (target == RLIM_INFINITY) {
    // Linux refuses a soft limit above fs.nr_open even when the hard limit is unlimited.
    uint64_t nr_open = 0;
    std::ifstream in("/proc/sys/fs/nr_open");
    if (in >> nr_open && nr_open > 0) target = static_cast<rlim_t>(nr_open);
  }
  if (rl.rlim_cur != RLIM_INFINITY && target > rl.rlim_cur) {
    rlimit raised = rl;
    raised.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return internalError(std::string("setrlimit(RLIMIT_NOFILE, ") + std::to_string(target) +
                           "): " + std::strerror(errno));
    }
  }
  change.after = descriptorLimit();
  return change;
}

std::optional<uint64_t> countOpenDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  uint64_t n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n > 0 ? n - 1 : 0;  // the directory's own descriptor
}

}  // namespace fedfleet::transport
