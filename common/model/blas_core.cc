#include "common/model/blas_core.h"

#include <dlfcn.h>
#include <strings.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace fedfleet::model {

std::string openblasCoreName() {
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (fn == nullptr) return "";
  const char* name = fn();
  return name == nullptr ? "" : name;
}

std::string cpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    const size_t colon = line.find(':');
    return colon == std::string::npos ? "" : line.substr(colon + 1);
  }
  return "";
}

std::optional<std::string> betterBlasCore(std::string_view detected, std::string_view flags) {
  if (detected.empty()) return std::nullopt;
  // OpenBLAS 0.3.21's cores with AVX2 (or wider) kernels, as openblas_get_corename spells them.
  static constexpr std::array<const char*, 6> kWide = {
      "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"};
  const std::string core(detected);
  for (const char* wide : kWide) {
    if (::strcasecmp(core.c_str(), wide) == 0) return std::nullopt;
  }
  std::set<std::string> has;
  std::istringstream words{std::string(flags)};
  for (std::string w; words >> w;) has.insert(w);
  auto all = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (!has.count(n)) return false;
    }
    return true;
  };
  if (all({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})) return "SkylakeX";
  if (all({"avx2", "fma"})) return "Haswell";
  return std::nullopt;
}

std::optional<std::string> blasCoreToAsk() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return std::nullopt;
  return betterBlasCore(openblasCoreName(), cpuFlags());
}

std::string fedfleetBlasCore() { return blasCoreToAsk().value_or(openblasCoreName()); }

}  // namespace fedfleet::model
