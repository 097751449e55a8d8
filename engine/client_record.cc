#include "engine/client_record.h"

namespace fedfleet::engine {

history::ClientRecord clientRecordOf(const std::string& id, const wire::Hello& hello,
                                     uint64_t data_size, double now) {
  history::ClientRecord rec;
  rec.client_id = id;
  rec.public_key = hello.public_key;
  rec.device_kind = wire::deviceKindName(hello.device_kind);
  rec.device_name = hello.device_name;
  rec.cores = hello.cores;
  rec.memory_bytes = hello.memory_bytes;
  rec.data_size = data_size;
  rec.first_seen = now;
  rec.last_seen = now;
  return rec;
}

}  // namespace fedfleet::engine
