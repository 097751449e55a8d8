// CSV input (RFC 4180, parsed by Debian's libcsv in strict mode), streamed: the file is read in
// blocks and each field and each row end handed to a visitor as it is parsed, so that a data
// file of millions of fields is never held as strings. The fleet files of the simulator and the
// CSV data source both read through here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::data {

class CsvVisitor {
 public:
  virtual ~CsvVisitor() = default;
  // Field `col` (0-based) of row `row` (0-based; the header, when the file has one, is row 0).
  // An error stops the reading and is returned by readCsv.
  virtual Status field(size_t row, size_t col, std::string_view text) = 0;
  // Row `row` ended after `fields` fields.
  virtual Status rowEnd(size_t row, size_t fields) = 0;
};

// Reads the CSV file at `path` into `visitor`. `what` names the file in messages ("data file",
// "fleet file"). Errors: kNotFound (cannot be opened), kIoError (a read failed), kInvalidArgument
// for text that is not CSV (an unbalanced quote, a quote inside an unquoted field), naming the
// file and the row, or the visitor's first error with the file's name in front. libcsv leaves
// out empty lines; the row numbers count rows, not lines.
Status readCsv(const std::string& path, const std::string& what, CsvVisitor& visitor);

// A small CSV file read whole: its rows of fields (the header first). For files of a few rows
// (configuration tables); data files go through a CsvVisitor.
Result<std::vector<std::vector<std::string>>> readCsvRows(const std::string& path,
                                                          const std::string& what);

}  // namespace fedfleet::data
