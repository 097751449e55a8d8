#include "common/data/csv_source.h"

#include <charconv>
#include <cmath>
#include <map>

#include "common/data/csv_reader.h"

namespace fedfleet::data {
namespace {

constexpr int kIgnored = -2;
constexpr int kLabel = -1;

std::string quoted(std::string_view s) {
  constexpr size_t kShown = 40;
  std::string out = "'" + std::string(s.substr(0, kShown));
  if (s.size() > kShown) out += "...";
  return out + "'";
}

class CsvDataVisitor : public CsvVisitor {
 public:
  CsvDataVisitor(const CsvColumns& columns, size_t limit, Dataset& out)
      : columns_(columns), limit_(limit), out_(out) {}

  Status field(size_t row, size_t col, std::string_view text) override {
    if (row == 0) {
      header_.emplace_back(text);
      return Status::ok();
    }
    if (col >= role_.size()) {
      return invalidArgument(where(row) + ": more fields than the " + std::to_string(role_.size()) +
                             " columns of the header");
    }
    const int role = role_[col];
    if (role == kIgnored) return Status::ok();
    if (role == kLabel) return takeLabel(row, col, text);
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
        !std::isfinite(v) || std::abs(v) > 3.4e38) {
      return invalidArgument(where(row) + ", column '" + header_[col] + "': " +
                             (text.empty() ? std::string("a missing value")
                                           : quoted(text) + " is not a finite number"));
    }
    if (keep(row)) row_features_[static_cast<size_t>(role)] = static_cast<float>(v);
    return Status::ok();
  }

  Status rowEnd(size_t row, size_t fields) override {
    if (row == 0) return resolveHeader();
    if (fields != role_.size()) {
      return invalidArgument(where(row) + ": " + std::to_string(fields) +
                             " fields, the header has " + std::to_string(role_.size()));
    }
    if (keep(row)) {
      out_.features.insert(out_.features.end(), row_features_.begin(), row_features_.end());
      if (columns_.regression) {
        out_.targets.push_back(row_target_);
      } else {
        out_.labels.push_back(row_label_);
        max_label_ = std::max(max_label_, row_label_);
      }
    }
    ++samples_;
    return Status::ok();
  }

  size_t samples() const { return samples_; }
  bool sawHeader() const { return !role_.empty(); }
  Label maxLabel() const { return max_label_; }

 private:
  // Rows are 1-based in messages and count the header, so that a file without quoted line
  // breaks or blank lines has row N on line N.
  static std::string where(size_t row) { return "row " + std::to_string(row + 1); }
  bool keep(size_t row) const { return limit_ == 0 || row <= limit_; }

  Status takeLabel(size_t row, size_t col, std::string_view text) {
    if (columns_.regression) {
      double t = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), t);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
          !std::isfinite(t) || std::abs(t) > 3.4e38) {
        return invalidArgument(
            where(row) + ", column '" + header_[col] + "': the target " +
            (text.empty() ? std::string("is missing") : quoted(text) + " is not a finite number") +
            " (data.task = \"regression\" takes numeric targets)");
      }
      row_target_ = static_cast<float>(t);
      return Status::ok();
    }
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0 ||
        v >= kMaxClasses) {
      return invalidArgument(
          where(row) + ", column '" + header_[col] + "': the label " +
          (text.empty() ? std::string("is missing") : quoted(text) + " is not a class id") +
          " (labels are integers from 0 to " + std::to_string(kMaxClasses - 1) + ")");
    }
    row_label_ = v;
    return Status::ok();
  }

  Status resolveHeader() {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < header_.size(); ++i) {
      if (header_[i].empty()) {
        return invalidArgument("row 1 (the header): column " + std::to_string(i + 1) +
                               " has no name");
      }
      if (!index.emplace(header_[i], i).second) {
        return invalidArgument("row 1 (the header): column '" + header_[i] + "' appears twice");
      }
    }
    auto find = [&](const std::string& name, const char* role) -> Result<size_t> {
      auto it = index.find(name);
      if (it == index.end()) {
        std::string names;
        for (const auto& h : header_) names += (names.empty() ? "" : ", ") + h;
        return invalidArgument(std::string("the ") + role + " column '" + name +
                               "' is not in the header (columns: " + names + ")");
      }
      return it->second;
    };
    role_.assign(header_.size(), kIgnored);
    FEDFLEET_ASSIGN_OR_RETURN(size_t label, find(columns_.label, "label"));
    role_[label] = kLabel;
    int k = 0;
    if (columns_.features.empty()) {
      for (size_t i = 0; i < header_.size(); ++i) {
        if (i != label) role_[i] = k++;
      }
    } else {
      for (const std::string& name : columns_.features) {
        FEDFLEET_ASSIGN_OR_RETURN(size_t i, find(name, "feature"));
        if (i == label) {
          return invalidArgument("column '" + name + "' is the label; it cannot be a feature");
        }
        if (role_[i] != kIgnored) {
          return invalidArgument("feature column '" + name + "' is named twice");
        }
        role_[i] = k++;
      }
    }
    if (k == 0) return invalidArgument("no feature columns: the header has only the label");
    row_features_.assign(static_cast<size_t>(k), 0.0f);
    out_.feature_dim = static_cast<uint32_t>(k);
    if (columns_.regression) out_.target_dim = 1;
    return Status::ok();
  }

  const CsvColumns& columns_;
  size_t limit_;
  Dataset& out_;
  std::vector<std::string> header_;
  std::vector<int> role_;  // per column: kIgnored, kLabel or the feature's index
  std::vector<float> row_features_;
  Label row_label_ = 0;
  float row_target_ = 0;
  Label max_label_ = 0;
  size_t samples_ = 0;
};

}  // namespace

Result<Dataset> loadCsv(const std::string& path, const CsvColumns& columns, size_t limit) {
  Dataset ds;
  CsvDataVisitor visitor(columns, limit, ds);
  FEDFLEET_RETURN_IF_ERROR(readCsv(path, "data file", visitor));
  if (!visitor.sawHeader()) {
    return invalidArgument("data file '" + path + "' is empty: it needs a header row and samples");
  }
  if (visitor.samples() == 0) {
    return invalidArgument("data file '" + path + "' has a header but no samples");
  }
  ds.num_classes =
      columns.regression ? 0 : static_cast<uint32_t>(std::max<Label>(2, visitor.maxLabel() + 1));
  return ds;
}

}  // namespace fedfleet::data
