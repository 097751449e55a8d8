// Cap'n Proto messages to and from one flat byte string, for the codecs of common/wire/ only
// (it includes Cap'n Proto's headers): the one place that turns a built message into bytes and
// bytes back into a root under DecodeLimits, so every codec refuses bad bytes the same way.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "common/check.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::wire {

// The bytes of `builder`'s message (segment table and segments). A Cap'n Proto exception here
// means a field over its size limits (kMaxFieldBytes), a caller bug: it aborts, as does running
// out of memory.
inline std::string writeFlat(capnp::MessageBuilder& builder) {
  try {
    auto segments = builder.getSegmentsForOutput();
    std::string out(capnp::computeSerializedSizeInWords(segments) * sizeof(capnp::word), '\0');
    kj::ArrayOutputStream stream(kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()), out.size()));
    capnp::writeMessage(stream, segments);
    FEDFLEET_CHECK(stream.getArray().size() == out.size());
    return out;
  } catch (const kj::Exception& e) {
    FEDFLEET_CHECK_MSG(false, e.getDescription().cStr());
  } catch (const std::exception& e) {
    FEDFLEET_CHECK_MSG(false, e.what());
  }
  return {};
}

// Parses `bytes` as one message with root `Root` and returns read(root). `what` names the
// bytes in errors ("frame"). Over limits.max_bytes: kResourceExhausted; empty, not whole words,
// trailing bytes, or anything Cap'n Proto refuses (traversal and nesting limits included):
// kCorrupt. Never throws.
template <typename Root, typename T, typename Read>
Result<T> readFlat(std::string_view bytes, const DecodeLimits& limits, const std::string& what,
                   Read read) {
  if (bytes.size() > limits.max_bytes) {
    return resourceExhausted(what + " of " + std::to_string(bytes.size()) +
                             " bytes exceeds limit of " + std::to_string(limits.max_bytes));
  }
  if (bytes.empty()) return corrupt("empty " + what);
  if (bytes.size() % sizeof(capnp::word) != 0) {
    return corrupt(what + " of " + std::to_string(bytes.size()) +
                   " bytes is not a whole number of 8-byte words");
  }
  try {
    const size_t n_words = bytes.size() / sizeof(capnp::word);
    kj::Array<capnp::word> aligned_copy;
    kj::ArrayPtr<const capnp::word> words;
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(capnp::word) == 0) {
      words = kj::arrayPtr(reinterpret_cast<const capnp::word*>(bytes.data()), n_words);
    } else {
      aligned_copy = kj::heapArray<capnp::word>(n_words);
      std::memcpy(aligned_copy.begin(), bytes.data(), bytes.size());
      words = aligned_copy;
    }
    capnp::ReaderOptions options;
    options.traversalLimitInWords = limits.traversal_limit_words;
    options.nestingLimit = static_cast<int>(std::min<uint32_t>(limits.nesting_limit, INT_MAX));
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end()) {
      return corrupt(what + " has " +
                     std::to_string((words.end() - reader.getEnd()) * sizeof(capnp::word)) +
                     " bytes after the message");
    }
    return read(reader.getRoot<Root>());
  } catch (const kj::Exception& e) {
    return corrupt("malformed " + what + ": " + e.getDescription().cStr());
  } catch (const std::bad_alloc&) {
    return resourceExhausted("out of memory decoding a " + what + " of " +
                             std::to_string(bytes.size()) + " bytes");
  } catch (const std::exception& e) {
    return corrupt("malformed " + what + ": " + e.what());
  } catch (...) {
    return corrupt("malformed " + what);
  }
}

}  // namespace fedfleet::wire
