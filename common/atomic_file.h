// Writing a file so that readers see the old content or the new, never a part of it.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace fedfleet {

// Writes `bytes` to a temporary file next to `path` (mode 0644), syncs it and renames it over
// `path`. On failure (kIoError naming the file and the reason) the temporary file is removed
// and `path` is left as it was.
Status writeFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace fedfleet
