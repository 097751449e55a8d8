#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace fedfleet {
namespace {

// Writes all of `bytes` to fd; false with errno set on failure.
bool writeAll(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Status writeFileAtomically(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return ioError("cannot create " + tmp + ": " + std::strerror(errno));
  ::fchmod(fd, 0644);
  if (!writeAll(fd, bytes) || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return ioError("writing " + tmp + ": " + why);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return ioError("publishing " + path + ": " + why);
  }
  return Status::ok();
}

Result<std::string> readWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return notFound("no such file " + path);
    return ioError("cannot open " + path + ": " + std::strerror(err));
  }
  // Sized from the file (one byte more, so the read that finds the end needs no growth);
  // doubled when a file grows while it is read or is not a regular file.
  struct stat info {};
  const bool regular = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  std::string bytes(regular ? static_cast<size_t>(info.st_size) + 1 : size_t{4} << 10, '\0');
  size_t size = 0;
  while (true) {
    if (size == bytes.size()) bytes.resize(2 * bytes.size());
    const ssize_t n = ::read(fd, bytes.data() + size, bytes.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return ioError("reading " + path + ": " + why);
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(size);
  return bytes;
}

}  // namespace fedfleet
