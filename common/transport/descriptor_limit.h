// The process's descriptor limit (RLIMIT_NOFILE) and the descriptors it has open.
//
// Every TCP connection of a server transport costs two descriptors (libzmq's and the duplicate
// the transport keeps, zmq_transport.cc), so a server raises its soft limit to the hard one at
// start (raiseDescriptorLimit) and its transport keeps a reserve below it for connections that
// authenticated (common/transport/connection_admission.h). Linux: counts come from /proc.
#pragma once

#include <cstdint>
#include <optional>

#include "common/status.h"

namespace fedfleet::transport {

struct DescriptorLimit {
  uint64_t soft = 0;  // UINT64_MAX: unlimited
  uint64_t hard = 0;
};

// The current RLIMIT_NOFILE.
DescriptorLimit descriptorLimit();

// Raises the soft limit to the hard limit (to the kernel's fs.nr_open when the hard limit is
// unlimited). Returns the limit before and after; kInternal, with errno's text, when setrlimit
// fails (the limit is then as it was).
struct DescriptorLimitChange {
  DescriptorLimit before;
  DescriptorLimit after;
};
Result<DescriptorLimitChange> raiseDescriptorLimit();

// Descriptors open in this process now (the entries of /proc/self/fd, less the one used to
// read it); nullopt when /proc cannot be read.
std::optional<uint64_t> countOpenDescriptors();

}  // namespace fedfleet::transport
