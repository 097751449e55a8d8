// Writing a file so that readers see the old content or the new, never a part of it; and
// reading one whole.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace fedfleet {

// Writes `bytes` to a temporary file next to `path` (mode 0644), syncs it and renames it over
// `path`. On failure (kIoError naming the file and the reason) the temporary file is removed
// and `path` is left as it was.
Status writeFileAtomically(const std::string& path, std::string_view bytes);

// The whole content of `path`. kNotFound when it does not exist, kIoError naming the file and
// the reason when it cannot be read.
Result<std::string> readWholeFile(const std::string& path);

}  // namespace fedfleet
