#include "common/chunk_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fedfleet {

Status ChunkLog::append(uint64_t token, uint64_t offset, uint64_t elements,
                        std::string_view payload) {
  Record r;
  r.offset = offset;
  r.elements = elements;
  if (in_memory_ + payload.size() <= bound_) {
    if (!spare_.empty()) {  // a freed buffer: no new pages to fault in
      r.payload = std::move(spare_.back());
      spare_.pop_back();
      spare_bytes_ -= r.payload.capacity();
    }
    r.payload.assign(payload);
    in_memory_ += payload.size();
  } else {
    if (!file_) {
      file_.reset(std::tmpfile());  // unlinked: it vanishes with the process
      if (!file_) return ioError(std::string("partial uploads: tmpfile: ") + std::strerror(errno));
    }
    if (std::fseek(file_.get(), 0, SEEK_END) != 0) {
      return ioError(std::string("partial uploads: seek: ") + std::strerror(errno));
    }
    r.file_pos = std::ftell(file_.get());
    r.file_bytes = payload.size();
    if (std::fwrite(payload.data(), 1, payload.size(), file_.get()) != payload.size() ||
        std::fflush(file_.get()) != 0) {
      return ioError(std::string("partial uploads: spilling ") + std::to_string(payload.size()) +
                     " bytes: " + std::strerror(errno));
    }
    spilled_ += payload.size();
  }
  records_[token].push_back(std::move(r));
  return Status::ok();
}

Status ChunkLog::forEach(uint64_t token,
                         const std::function<Status(uint64_t, uint64_t, std::string_view)>& fn) {
  auto it = records_.find(token);
  if (it == records_.end()) return Status::ok();
  std::string buffer;
  for (const Record& r : it->second) {
    if (r.file_pos < 0) {
      FEDFLEET_RETURN_IF_ERROR(fn(r.offset, r.elements, r.payload));
      continue;
    }
    buffer.resize(r.file_bytes);
    if (std::fseek(file_.get(), r.file_pos, SEEK_SET) != 0 ||
        std::fread(buffer.data(), 1, buffer.size(), file_.get()) != buffer.size()) {
      return ioError(std::string("partial uploads: reading back a spilled chunk: ") +
                     std::strerror(errno));
    }
    FEDFLEET_RETURN_IF_ERROR(fn(r.offset, r.elements, buffer));
  }
  return Status::ok();
}

void ChunkLog::recycle(std::vector<Record>& records) {
  for (Record& r : records) {
    if (r.file_pos >= 0) continue;
    in_memory_ -= r.payload.size();
    const uint64_t cap = r.payload.capacity();
    if (cap > 0 && spare_bytes_ + in_memory_ + cap <= bound_) {
      spare_bytes_ += cap;
      spare_.push_back(std::move(r.payload));
    }
  }
}

void ChunkLog::erase(uint64_t token) {
  auto it = records_.find(token);
  if (it == records_.end()) return;
  recycle(it->second);
  records_.erase(it);
}

void ChunkLog::clear() {
  for (auto& [token, records] : records_) recycle(records);
  records_.clear();
  in_memory_ = 0;
  spilled_ = 0;
  if (file_) {
    std::fflush(file_.get());
    if (ftruncate(fileno(file_.get()), 0) != 0) file_.reset();  // a fresh file next time
  }
}

}  // namespace fedfleet
