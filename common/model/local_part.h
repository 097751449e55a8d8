// The local part of a model (model.local): parameters and buffers whose names match one of the
// configured patterns stay on each client and out of aggregation, as FedBN keeps its BatchNorm
// layers local and FedPer its head.
//
// A client starts each task from the global model with its own local values written over the
// matching tensors (the global values the first time), trains, keeps the trained local values,
// and uploads a delta whose local entries are 0: every aggregator then leaves the global local
// part as it was. The coordinator's model carries the initial local values; its evaluation is
// of the shared part with them.
//
// LocalValues is the client's copy, kept across tasks and (saved to a file) across restarts.
// File format, little endian: the 8 bytes "FFLOCAL1", the value count n (uint64), n fp32
// values, then the SHA-256 of everything before it; written to a temporary file and renamed
// over the target (writeFileAtomically), so a crash leaves the old file or the new one.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::model {

class LocalPart {
 public:
  // The tensors of `layout` whose names match one of `patterns` (fnmatch(3) globs: "bn*",
  // "*.running_*", "head.*"). kInvalidArgument naming a pattern that matches no tensor (with
  // the tensor names), or when every tensor would be local (nothing left to federate).
  static Result<LocalPart> of(const Layout& layout, const std::vector<std::string>& patterns);
  LocalPart() = default;

  bool empty() const { return values_ == 0; }
  // Values in the local part, and the [offset, offset + count) ranges of the flat model.
  size_t values() const { return values_; }
  const std::vector<std::pair<size_t, size_t>>& ranges() const { return ranges_; }
  // Names of the local tensors, in layout order.
  const std::vector<std::string>& names() const { return names_; }
  // Whether tensor `name` of the layout is local.
  bool isLocal(const std::string& name) const;

  // The local entries of a flat model of the layout's total, in range order.
  std::vector<float> gather(const std::vector<float>& flat) const;
  // Writes `local` (values() floats) over the local entries of `flat`.
  void scatter(const std::vector<float>& local, std::vector<float>& flat) const;
  // Sets the local entries of `flat` to 0.
  void zero(std::vector<float>& flat) const;

 private:
  std::vector<std::pair<size_t, size_t>> ranges_;
  std::vector<std::string> names_;
  size_t values_ = 0;
};

// Writes `values` to `path` in the format above. kIoError naming the file when it cannot be
// written (the old file, if any, is untouched).
Status saveLocalValues(const std::string& path, const std::vector<float>& values);
// Reads a file saveLocalValues wrote. kNotFound when it does not exist; kCorrupt naming the
// file for a bad magic number, a size that does not match its count, a checksum mismatch, a
// non-finite value, or a count other than `expected`.
Result<std::vector<float>> loadLocalValues(const std::string& path, size_t expected);

// The local part and a client's values of it, before and after a task.
struct LocalState {
  LocalPart part;
  std::vector<float> values;  // empty until the client first trained (then part.values())
  std::string path;           // "": kept in memory only

  // What a client starts from: `path`'s values when the file holds part.values() of them;
  // none (the global values at first) when it does not exist. A corrupt file is an error
  // naming it (the client does not silently forget its own model).
  static Result<LocalState> open(LocalPart part, const std::string& path);
  // The start of a task: `global` with the client's local values written over it.
  void applyTo(std::vector<float>& start) const;
  // After training from `start` (applyTo's result) to start + delta: keeps the trained local
  // values (saved to `path` when set) and zeroes the delta's local entries.
  Status absorb(const std::vector<float>& start, std::vector<float>& delta);
};

}  // namespace fedfleet::model
