#include "common/data/csv_reader.h"

#include <csv.h>

#include <fstream>
#include <memory>

namespace fedfleet::data {
namespace {

struct ParseState {
  CsvVisitor* visitor;
  size_t row = 0;
  size_t col = 0;
  Status status = Status::ok();
};

void onField(void* data, size_t len, void* opaque) {
  auto* s = static_cast<ParseState*>(opaque);
  if (!s->status.isOk()) return;
  s->status = s->visitor->field(s->row, s->col, std::string_view(static_cast<char*>(data), len));
  ++s->col;
}

void onRowEnd(int /*terminator*/, void* opaque) {
  auto* s = static_cast<ParseState*>(opaque);
  if (!s->status.isOk()) return;
  s->status = s->visitor->rowEnd(s->row, s->col);
  ++s->row;
  s->col = 0;
}

class RowCollector : public CsvVisitor {
 public:
  Status field(size_t, size_t, std::string_view text) override {
    current_.emplace_back(text);
    return Status::ok();
  }
  Status rowEnd(size_t, size_t) override {
    rows_.push_back(std::move(current_));
    current_.clear();
    return Status::ok();
  }
  std::vector<std::vector<std::string>> take() { return std::move(rows_); }

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> current_;
};

}  // namespace

Status readCsv(const std::string& path, const std::string& what, CsvVisitor& visitor) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(what + " '" + path + "' cannot be opened");
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) != 0) {
    return internalError("csv_init failed");
  }
  std::unique_ptr<csv_parser, void (*)(csv_parser*)> owner(&parser, csv_free);
  ParseState state{&visitor};
  auto failed = [&](const Status& st) { return st.withContext(what + " '" + path + "'"); };
  std::vector<char> block(1 << 20);
  while (in && state.status.isOk()) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    if (in.bad()) return ioError(what + " '" + path + "': read failed");
    if (got == 0) break;
    if (csv_parse(&parser, block.data(), got, onField, onRowEnd, &state) != got) {
      if (!state.status.isOk()) break;
      return invalidArgument(what + " '" + path + "': not valid CSV (" +
                             csv_strerror(csv_error(&parser)) + ") in row " +
                             std::to_string(state.row + 1));
    }
  }
  if (!state.status.isOk()) return failed(state.status);
  if (csv_fini(&parser, onField, onRowEnd, &state) != 0) {
    return invalidArgument(what + " '" + path + "': not valid CSV (" +
                           csv_strerror(csv_error(&parser)) + ") in row " +
                           std::to_string(state.row + 1));
  }
  if (!state.status.isOk()) return failed(state.status);
  return Status::ok();
}

Result<std::vector<std::vector<std::string>>> readCsvRows(const std::string& path,
                                                          const std::string& what) {
  RowCollector rows;
  FEDFLEET_RETURN_IF_ERROR(readCsv(path, what, rows));
  return rows.take();
}

}  // namespace fedfleet::data
