// Fuzzes the run configuration of common/config/config.h: Config::loadString over arbitrary
// TOML text, then validate(), and for a Config that loaded and validated toJson().dump(), which
// the coordinator and the simulator record in the history. loadString and validate must answer
// INVALID_ARGUMENT or OK, never throw or crash, also on a Config that a failed load left partly
// set; toJson().dump() must not throw.
//
// Input: the TOML text, all of it.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config/config.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fedfleet::StatusCode;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fedfleet::config::Config config;
  const fedfleet::Status loaded = config.loadString(text, "fuzz.toml");
  FUZZ_CHECK(loaded.isOk() || loaded.code() == StatusCode::kInvalidArgument,
             loaded.toString().c_str());
  const fedfleet::Status valid = config.validate();
  FUZZ_CHECK(valid.isOk() || valid.code() == StatusCode::kInvalidArgument,
             valid.toString().c_str());
  if (loaded.isOk() && valid.isOk()) {
    std::string json;
    try {
      json = config.toJson().dump();
    } catch (const std::exception& e) {
      FUZZ_CHECK(false, e.what());
    }
    FUZZ_CHECK(!json.empty(), "empty JSON");
  }
  return 0;
}
