#include "common/history/format.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

namespace fedfleet::history {
namespace {

// One field of a record in the machine formats (CSV, JSON).
using Value = std::variant<std::monostate, int64_t, uint64_t, double, std::string>;

template <typename Record>
struct Field {
  const char* name;
  Value (*get)(const Record&);
};

// One column of the table format.
template <typename Record>
struct Column {
  const char* name;
  bool right_aligned;
  std::string (*get)(const Record&);
};

Value optionalValue(const std::optional<double>& v) {
  if (!v) return std::monostate{};
  return *v;
}

// Metrics as the history stores them: a JSON object in their order; none: null.
Value metricsValue(const Metrics& m) {
  if (m.empty()) return std::monostate{};
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, v] : m) j[name] = v;
  return j.dump();
}

// Shortest text that parses back to the same double. Like JavaScript's number printing,
// plain digits for magnitudes in [1e-6, 1e21) ("1700000000", "0.1") and exponent notation
// outside ("1e-300"), so unix times stay readable; "nan", "inf", "-inf" for the rest.
std::string fullPrecision(double v) {
  char buf[128];  // fixed notation in that range needs at most ~30 characters
  const double magnitude = std::fabs(v);
  const bool plain = magnitude == 0.0 || (magnitude >= 1e-6 && magnitude < 1e21);
  auto [end, ec] = std::isfinite(v) && plain
                       ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                       : std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  if (ec != std::errc()) return "nan";  // cannot happen: the buffer holds any such value
  std::string text(buf, end);
  // "1e+21" -> "1e21"; the exponent's sign is kept only when negative.
  if (auto plus = text.find("e+"); plus != std::string::npos) text.erase(plus + 1, 1);
  return text;
}

std::string csvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string csvValue(const Value& v) {
  struct Visitor {
    std::string operator()(std::monostate) const { return ""; }
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(uint64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const { return fullPrecision(x); }
    std::string operator()(const std::string& x) const { return csvField(x); }
  };
  return std::visit(Visitor{}, v);
}

nlohmann::ordered_json jsonValue(const Value& v) {
  struct Visitor {
    nlohmann::ordered_json operator()(std::monostate) const { return nullptr; }
    nlohmann::ordered_json operator()(int64_t x) const { return x; }
    nlohmann::ordered_json operator()(uint64_t x) const { return x; }
    nlohmann::ordered_json operator()(double x) const { return x; }
    nlohmann::ordered_json operator()(const std::string& x) const { return x; }
  };
  return std::visit(Visitor{}, v);
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// "mse=0.2500 mae=0.4000" for a table; "-" when there are none.
std::string metricsCell(const Metrics& m) {
  if (m.empty()) return "-";
  std::string out;
  for (const auto& [name, v] : m) {
    out += (out.empty() ? "" : " ") + name + "=" + fixed(v, 4);
  }
  return out;
}

std::string optionalFixed(const std::optional<double>& v, int decimals) {
  return v ? fixed(*v, decimals) : "-";
}

// A fraction as a percentage with two decimals ("-" when absent).
std::string percent(const std::optional<double>& v) { return v ? fixed(*v * 100.0, 2) + "%" : "-"; }

// An update's served-model field: `v`, or null when the task named no served model.
Value served(const UpdateRecord& r, Value v) {
  if (r.served_block < 0) return std::monostate{};
  return v;
}

// "b<block> <model> v<version>" of the served model, "-" when none.
std::string servedName(const UpdateRecord& r) {
  if (r.served_block < 0) return "-";
  return "b" + std::to_string(r.served_block) + " " + r.served_model + " v" +
         std::to_string(r.served_version);
}

// UTC "YYYY-MM-DD HH:MM:SS" of unix seconds; "-" when not representable.
std::string utcTime(double unix_seconds) {
  if (!std::isfinite(unix_seconds) || std::fabs(unix_seconds) > 1e12) return "-";
  std::time_t t = static_cast<std::time_t>(std::floor(unix_seconds));
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return "-";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// A time in a table cell on its clock: a wall-clock time as its UTC date, a virtual-clock one
// as seconds from the run's start.
std::string clockTime(double seconds, bool virtual_clock) {
  if (!virtual_clock) return utcTime(seconds);
  if (!std::isfinite(seconds)) return "-";
  return "t=" + fixed(seconds, 2) + " s";
}

// A clients-table time: its value says its clock (format.h).
std::string seenTime(double seconds) {
  return clockTime(seconds, std::isfinite(seconds) && seconds < kEarliestWallClockTime);
}

// Text for one table cell: control characters escaped so a row stays on one line.
std::string tableText(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Width on a terminal, counting UTF-8 code points rather than bytes.
size_t displayWidth(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

template <typename Record>
std::string renderTable(const std::vector<Record>& records,
                        const std::vector<Column<Record>>& columns) {
  std::vector<std::vector<std::string>> cells;
  cells.reserve(records.size() + 1);
  cells.emplace_back();
  for (const auto& column : columns) cells.back().push_back(column.name);
  for (const Record& record : records) {
    cells.emplace_back();
    for (const auto& column : columns) cells.back().push_back(tableText(column.get(record)));
  }
  std::vector<size_t> widths(columns.size(), 0);
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], displayWidth(row[i]));
  }
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(widths[i] - displayWidth(row[i]), ' ');
      if (i > 0) line += "  ";
      if (columns[i].right_aligned) {
        line += pad + row[i];
      } else {
        line += row[i];
        if (i + 1 < row.size()) line += pad;  // no trailing blanks
      }
    }
    out += line;
    out += '\n';
  }
  return out;
}

template <typename Record>
std::string renderCsv(const std::vector<Record>& records,
                      const std::vector<Field<Record>>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += ',';
    out += csvField(fields[i].name);
  }
  out += "\r\n";
  for (const Record& record : records) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) out += ',';
      out += csvValue(fields[i].get(record));
    }
    out += "\r\n";
  }
  return out;
}

template <typename Record>
std::string renderJson(const std::vector<Record>& records,
                       const std::vector<Field<Record>>& fields) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const Record& record : records) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (const auto& field : fields) object[field.name] = jsonValue(field.get(record));
    array.push_back(std::move(object));
  }
  // `replace`: invalid UTF-8 becomes U+FFFD instead of a thrown type_error.
  return array.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

template <typename Record>
std::string render(const std::vector<Record>& records, Format format,
                   const std::vector<Field<Record>>& fields,
                   const std::vector<Column<Record>>& columns) {
  switch (format) {
    case Format::kTable:
      return renderTable(records, columns);
    case Format::kCsv:
      return renderCsv(records, fields);
    case Format::kJson:
      return renderJson(records, fields);
  }
  return renderTable(records, columns);
}

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

Result<Format> parseFormat(std::string_view name) {
  if (name == "table") return Format::kTable;
  if (name == "csv") return Format::kCsv;
  if (name == "json") return Format::kJson;
  return invalidArgument("unknown output format '" + std::string(name) +
                         "'; valid formats are table, csv, json");
}

std::string roundMetricsText(const RoundRecord& r) {
  std::string out;
  auto number = [](double v) { return fmt::format("{:.4g}", v); };
  auto add = [&](const char* prefix, const std::optional<double>& loss,
                 const std::optional<double>& accuracy, const Metrics& metrics) {
    if (!loss && !accuracy && metrics.empty()) return;
    if (!out.empty()) out += "  ";
    out += prefix;
    if (accuracy) out += fmt::format(" acc {:.2f}%", 100 * *accuracy);
    if (loss) out += " loss " + number(*loss);
    for (const auto& [name, value] : metrics) out += " " + name + " " + number(value);
  };
  add("test", r.test_loss, r.test_accuracy, r.test_metrics);
  const size_t before = out.size();
  add("fed", r.fed_eval_loss, r.fed_eval_accuracy, r.fed_eval_metrics);
  if (out.size() > before) {
    out += fmt::format(" (federated, {} client{})", r.fed_eval_clients,
                       r.fed_eval_clients == 1 ? "" : "s");
  }
  return out;
}

std::string formatRounds(const std::vector<RoundRecord>& rounds, Format format) {
  using R = RoundRecord;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"round", [](const R& r) -> Value { return uint64_t{r.round}; }},
      {"start_time", [](const R& r) -> Value { return r.start_time; }},
      {"end_time", [](const R& r) -> Value { return r.end_time; }},
      {"selected", [](const R& r) -> Value { return uint64_t{r.selected}; }},
      {"completed", [](const R& r) -> Value { return uint64_t{r.completed}; }},
      {"late", [](const R& r) -> Value { return uint64_t{r.late}; }},
      {"dropped", [](const R& r) -> Value { return uint64_t{r.dropped}; }},
      {"rejected", [](const R& r) -> Value { return uint64_t{r.rejected}; }},
      {"status", [](const R& r) -> Value { return r.status; }},
      {"train_loss", [](const R& r) -> Value { return r.train_loss; }},
      {"test_loss", [](const R& r) -> Value { return optionalValue(r.test_loss); }},
      {"test_accuracy", [](const R& r) -> Value { return optionalValue(r.test_accuracy); }},
      {"bytes_up", [](const R& r) -> Value { return r.bytes_up; }},
      {"bytes_down", [](const R& r) -> Value { return r.bytes_down; }},
      {"model_version", [](const R& r) -> Value { return r.model_version; }},
      {"wall_start", [](const R& r) -> Value { return r.wall_start; }},
      {"wall_end", [](const R& r) -> Value { return r.wall_end; }},
      {"fed_eval_clients", [](const R& r) -> Value { return uint64_t{r.fed_eval_clients}; }},
      {"fed_eval_samples", [](const R& r) -> Value { return r.fed_eval_samples; }},
      {"fed_eval_loss", [](const R& r) -> Value { return optionalValue(r.fed_eval_loss); }},
      {"fed_eval_accuracy", [](const R& r) -> Value { return optionalValue(r.fed_eval_accuracy); }},
      {"test_metrics", [](const R& r) -> Value { return metricsValue(r.test_metrics); }},
      {"fed_eval_metrics", [](const R& r) -> Value { return metricsValue(r.fed_eval_metrics); }},
      {"dp_epsilon", [](const R& r) -> Value { return optionalValue(r.dp_epsilon); }},
      {"dp_clip", [](const R& r) -> Value { return optionalValue(r.dp_clip); }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"round", true, [](const R& r) { return str(r.round); }},
      {"status", false, [](const R& r) { return r.status; }},
      {"selected", true, [](const R& r) { return str(r.selected); }},
      {"completed", true, [](const R& r) { return str(r.completed); }},
      {"late", true, [](const R& r) { return str(r.late); }},
      {"dropped", true, [](const R& r) { return str(r.dropped); }},
      {"rejected", true, [](const R& r) { return str(r.rejected); }},
      {"train_loss", true, [](const R& r) { return fixed(r.train_loss, 4); }},
      {"test_loss", true, [](const R& r) { return optionalFixed(r.test_loss, 4); }},
      {"test_acc", true,
       [](const R& r) {
         return r.test_accuracy ? fixed(*r.test_accuracy * 100.0, 2) + "%" : std::string("-");
       }},
      {"fed_acc", true, [](const R& r) { return percent(r.fed_eval_accuracy); }},
      {"metrics", false,
       [](const R& r) {
         return metricsCell(r.test_metrics.empty() ? r.fed_eval_metrics : r.test_metrics);
       }},
      {"epsilon", true, [](const R& r) { return optionalFixed(r.dp_epsilon, 3); }},
      {"bytes_up", true, [](const R& r) { return str(r.bytes_up); }},
      {"bytes_down", true, [](const R& r) { return str(r.bytes_down); }},
      {"seconds", true, [](const R& r) { return fixed(r.end_time - r.start_time, 2); }},
      {"wall_s", true, [](const R& r) { return fixed(r.wall_end - r.wall_start, 2); }},
  };
  return render(rounds, format, kFields, kColumns);
}

std::string formatRuns(const std::vector<RunRecord>& runs, Format format) {
  using R = RunRecord;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"name", [](const R& r) -> Value { return r.name; }},
      {"config_json", [](const R& r) -> Value { return r.config_json; }},
      {"started_at", [](const R& r) -> Value { return r.started_at; }},
      {"seed", [](const R& r) -> Value { return r.seed; }},
      {"clock", [](const R& r) -> Value { return r.clock; }},
      {"model_json", [](const R& r) -> Value { return r.model_json; }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"run_id", true, [](const R& r) { return std::to_string(r.run_id); }},
      {"name", false, [](const R& r) { return r.name; }},
      {"started_at", false, [](const R& r) { return utcTime(r.started_at); }},
      {"seed", true, [](const R& r) { return str(r.seed); }},
      {"clock", false, [](const R& r) { return r.clock; }},
  };
  return render(runs, format, kFields, kColumns);
}

std::string formatUpdates(const std::vector<UpdateRecord>& updates, Format format) {
  using R = UpdateRecord;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"round", [](const R& r) -> Value { return uint64_t{r.round}; }},
      {"client_id", [](const R& r) -> Value { return r.client_id; }},
      {"partition", [](const R& r) -> Value { return int64_t{r.partition}; }},
      {"n_samples", [](const R& r) -> Value { return r.n_samples; }},
      {"steps", [](const R& r) -> Value { return r.steps; }},
      {"loss", [](const R& r) -> Value { return r.loss; }},
      {"compute_s", [](const R& r) -> Value { return r.compute_s; }},
      {"upload_s", [](const R& r) -> Value { return r.upload_s; }},
      {"bytes_up", [](const R& r) -> Value { return r.bytes_up; }},
      {"bytes_down", [](const R& r) -> Value { return r.bytes_down; }},
      {"weight", [](const R& r) -> Value { return r.weight; }},
      {"status", [](const R& r) -> Value { return r.status; }},
      {"start_time", [](const R& r) -> Value { return r.start_time; }},
      {"end_time", [](const R& r) -> Value { return r.end_time; }},
      {"wall_compute_s", [](const R& r) -> Value { return r.wall_compute_s; }},
      {"codec", [](const R& r) -> Value { return r.codec; }},
      {"encode_s", [](const R& r) -> Value { return r.encode_s; }},
      {"decode_s", [](const R& r) -> Value { return r.decode_s; }},
      {"served_block", [](const R& r) -> Value { return served(r, int64_t{r.served_block}); }},
      {"served_model", [](const R& r) -> Value { return served(r, r.served_model); }},
      {"served_version", [](const R& r) -> Value { return served(r, r.served_version); }},
      {"served_sha256", [](const R& r) -> Value { return served(r, r.served_sha256_hex); }},
      {"served_bytes", [](const R& r) -> Value { return served(r, r.served_bytes); }},
      {"served_samples", [](const R& r) -> Value { return served(r, r.served_samples); }},
      {"served_loss", [](const R& r) -> Value { return optionalValue(r.served_loss); }},
      {"served_accuracy", [](const R& r) -> Value { return optionalValue(r.served_accuracy); }},
      {"grant_wait_s", [](const R& r) -> Value { return r.grant_wait_s; }},
      {"eval_samples", [](const R& r) -> Value { return r.eval_samples; }},
      {"eval_loss", [](const R& r) -> Value { return optionalValue(r.eval_loss); }},
      {"eval_accuracy", [](const R& r) -> Value { return optionalValue(r.eval_accuracy); }},
      {"eval_metrics", [](const R& r) -> Value { return metricsValue(r.eval_metrics); }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"round", true, [](const R& r) { return str(r.round); }},
      {"client_id", false, [](const R& r) { return r.client_id; }},
      {"status", false, [](const R& r) { return r.status; }},
      {"partition", true, [](const R& r) { return std::to_string(r.partition); }},
      {"n_samples", true, [](const R& r) { return str(r.n_samples); }},
      {"steps", true, [](const R& r) { return str(r.steps); }},
      {"loss", true, [](const R& r) { return fixed(r.loss, 4); }},
      {"compute_s", true, [](const R& r) { return fixed(r.compute_s, 2); }},
      {"upload_s", true, [](const R& r) { return fixed(r.upload_s, 2); }},
      {"bytes_up", true, [](const R& r) { return str(r.bytes_up); }},
      {"bytes_down", true, [](const R& r) { return str(r.bytes_down); }},
      {"codec", false, [](const R& r) { return r.codec.empty() ? std::string("-") : r.codec; }},
      {"weight", true, [](const R& r) { return fixed(r.weight, 4); }},
      {"served", false, [](const R& r) { return servedName(r); }},
      {"served_acc", true, [](const R& r) { return percent(r.served_accuracy); }},
      {"eval_acc", true, [](const R& r) { return percent(r.eval_accuracy); }},
      {"eval_metrics", false, [](const R& r) { return metricsCell(r.eval_metrics); }},
  };
  return render(updates, format, kFields, kColumns);
}

std::string formatServed(const std::vector<UpdateRecord>& updates, Format format) {
  // The last update of each client that names a served model, in client order.
  std::map<std::string, const UpdateRecord*> last;
  for (const auto& u : updates) {
    if (u.served_block >= 0) last[u.client_id] = &u;
  }
  std::vector<UpdateRecord> rows;
  for (const auto& [id, u] : last) rows.push_back(*u);
  using R = UpdateRecord;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"client_id", [](const R& r) -> Value { return r.client_id; }},
      {"round", [](const R& r) -> Value { return uint64_t{r.round}; }},
      {"block", [](const R& r) -> Value { return int64_t{r.served_block}; }},
      {"model", [](const R& r) -> Value { return r.served_model; }},
      {"version", [](const R& r) -> Value { return r.served_version; }},
      {"sha256", [](const R& r) -> Value { return r.served_sha256_hex; }},
      {"samples", [](const R& r) -> Value { return r.served_samples; }},
      {"loss", [](const R& r) -> Value { return optionalValue(r.served_loss); }},
      {"accuracy", [](const R& r) -> Value { return optionalValue(r.served_accuracy); }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"client_id", false, [](const R& r) { return r.client_id; }},
      {"round", true, [](const R& r) { return str(r.round); }},
      {"block", true, [](const R& r) { return std::to_string(r.served_block); }},
      {"model", false, [](const R& r) { return r.served_model; }},
      {"version", true, [](const R& r) { return str(r.served_version); }},
      {"sha256", false, [](const R& r) { return r.served_sha256_hex.substr(0, 12); }},
      {"samples", true, [](const R& r) { return str(r.served_samples); }},
      {"accuracy", true, [](const R& r) { return percent(r.served_accuracy); }},
      {"loss", true, [](const R& r) { return optionalFixed(r.served_loss, 4); }},
  };
  return render(rows, format, kFields, kColumns);
}

std::string formatClients(const std::vector<ClientRecord>& clients, Format format) {
  using R = ClientRecord;
  static const std::vector<Field<R>> kFields = {
      {"client_id", [](const R& r) -> Value { return r.client_id; }},
      {"public_key", [](const R& r) -> Value { return r.public_key; }},
      {"device_kind", [](const R& r) -> Value { return r.device_kind; }},
      {"device_name", [](const R& r) -> Value { return r.device_name; }},
      {"cores", [](const R& r) -> Value { return uint64_t{r.cores}; }},
      {"memory_bytes", [](const R& r) -> Value { return r.memory_bytes; }},
      {"data_size", [](const R& r) -> Value { return r.data_size; }},
      {"first_seen", [](const R& r) -> Value { return r.first_seen; }},
      {"last_seen", [](const R& r) -> Value { return r.last_seen; }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"client_id", false, [](const R& r) { return r.client_id; }},
      {"device_kind", false, [](const R& r) { return r.device_kind; }},
      {"device_name", false, [](const R& r) { return r.device_name; }},
      {"cores", true, [](const R& r) { return str(r.cores); }},
      {"memory_bytes", true, [](const R& r) { return str(r.memory_bytes); }},
      {"data_size", true, [](const R& r) { return str(r.data_size); }},
      {"first_seen", false, [](const R& r) { return seenTime(r.first_seen); }},
      {"last_seen", false, [](const R& r) { return seenTime(r.last_seen); }},
  };
  return render(clients, format, kFields, kColumns);
}

std::string formatEvents(const std::vector<EventRecord>& events, Format format,
                         const std::set<int64_t>& virtual_clock_runs) {
  // The record and the clock its time is on.
  struct Row {
    const EventRecord* event;
    bool virtual_clock;
  };
  std::vector<Row> rows;
  rows.reserve(events.size());
  for (const auto& e : events) {
    rows.push_back({&e, e.run_id != 0 && virtual_clock_runs.count(e.run_id) > 0});
  }
  using R = Row;
  static const std::vector<Field<R>> kFields = {
      {"run_id",
       [](const R& r) -> Value {
         if (r.event->run_id == 0) return std::monostate{};
         return r.event->run_id;
       }},
      {"time", [](const R& r) -> Value { return r.event->time; }},
      {"kind", [](const R& r) -> Value { return r.event->kind; }},
      {"client_id", [](const R& r) -> Value { return r.event->client_id; }},
      {"detail", [](const R& r) -> Value { return r.event->detail; }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"run_id", true,
       [](const R& r) {
         return r.event->run_id == 0 ? std::string("-") : std::to_string(r.event->run_id);
       }},
      {"time", false, [](const R& r) { return clockTime(r.event->time, r.virtual_clock); }},
      {"kind", false, [](const R& r) { return r.event->kind; }},
      {"client_id", false, [](const R& r) { return r.event->client_id; }},
      {"detail", false, [](const R& r) { return r.event->detail; }},
  };
  return render(rows, format, kFields, kColumns);
}

namespace {

// The share of a tier's updates that were late or dropped; nullopt without updates.
std::optional<double> lateOrDropped(const TierSummary& t) {
  if (t.updates == 0) return std::nullopt;
  return static_cast<double>(t.late + t.dropped) / static_cast<double>(t.updates);
}

}  // namespace

std::string formatTiers(int64_t run_id, const std::vector<TierSummary>& tiers, Format format) {
  struct Row {
    int64_t run_id;
    const TierSummary* tier;
  };
  std::vector<Row> rows;
  rows.reserve(tiers.size());
  for (const auto& t : tiers) rows.push_back({run_id, &t});
  using R = Row;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"tier", [](const R& r) -> Value { return r.tier->tier; }},
      {"device_kind", [](const R& r) -> Value { return r.tier->device_kind; }},
      {"clients", [](const R& r) -> Value { return r.tier->clients; }},
      {"updates", [](const R& r) -> Value { return r.tier->updates; }},
      {"completed", [](const R& r) -> Value { return r.tier->completed; }},
      {"late", [](const R& r) -> Value { return r.tier->late; }},
      {"dropped", [](const R& r) -> Value { return r.tier->dropped; }},
      {"rejected", [](const R& r) -> Value { return r.tier->rejected; }},
      {"late_or_dropped",
       [](const R& r) -> Value { return optionalValue(lateOrDropped(*r.tier)); }},
      {"mean_completed_s", [](const R& r) -> Value { return r.tier->mean_completed_s; }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"tier", false, [](const R& r) { return r.tier->tier; }},
      {"device_kind", false,
       [](const R& r) {
         return r.tier->device_kind.empty() ? std::string("-") : r.tier->device_kind;
       }},
      {"clients", true, [](const R& r) { return str(r.tier->clients); }},
      {"updates", true, [](const R& r) { return str(r.tier->updates); }},
      {"completed", true, [](const R& r) { return str(r.tier->completed); }},
      {"late", true, [](const R& r) { return str(r.tier->late); }},
      {"dropped", true, [](const R& r) { return str(r.tier->dropped); }},
      {"rejected", true, [](const R& r) { return str(r.tier->rejected); }},
      {"late_or_dropped", true, [](const R& r) { return percent(lateOrDropped(*r.tier)); }},
      {"mean_completed_s", true,
       [](const R& r) {
         return r.tier->completed == 0 ? std::string("-") : fixed(r.tier->mean_completed_s, 2);
       }},
  };
  return render(rows, format, kFields, kColumns);
}

std::string formatBlockMetrics(const std::vector<BlockMetricRecord>& rows, Format format) {
  using R = BlockMetricRecord;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"round", [](const R& r) -> Value { return uint64_t{r.round}; }},
      {"block", [](const R& r) -> Value { return r.block; }},
      {"model", [](const R& r) -> Value { return r.model; }},
      {"accuracy", [](const R& r) -> Value { return optionalValue(r.accuracy); }},
      {"loss", [](const R& r) -> Value { return optionalValue(r.loss); }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"round", true, [](const R& r) { return str(r.round); }},
      {"block", true, [](const R& r) { return r.block; }},
      {"model", false, [](const R& r) { return r.model; }},
      {"accuracy", true, [](const R& r) { return percent(r.accuracy); }},
      {"loss", true, [](const R& r) { return optionalFixed(r.loss, 4); }},
  };
  return render(rows, format, kFields, kColumns);
}

std::string formatPeers(int64_t run_id, const std::vector<PeerSummary>& peers, Format format) {
  struct Row {
    int64_t run_id;
    const PeerSummary* peer;
  };
  std::vector<Row> rows;
  rows.reserve(peers.size());
  for (const auto& p : peers) rows.push_back({run_id, &p});
  using R = Row;
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"peer", [](const R& r) -> Value { return uint64_t{r.peer->peer}; }},
      {"iterations", [](const R& r) -> Value { return r.peer->iterations; }},
      {"skipped", [](const R& r) -> Value { return r.peer->skipped; }},
      {"exchanges", [](const R& r) -> Value { return r.peer->exchanges; }},
      {"bytes_sent", [](const R& r) -> Value { return r.peer->bytes_sent; }},
      {"bytes_received", [](const R& r) -> Value { return r.peer->bytes_received; }},
      {"compute_s", [](const R& r) -> Value { return r.peer->compute_s; }},
      {"comm_s", [](const R& r) -> Value { return r.peer->comm_s; }},
      {"wait_s", [](const R& r) -> Value { return r.peer->wait_s; }},
      {"mean_staleness", [](const R& r) -> Value { return r.peer->mean_staleness; }},
      {"max_staleness", [](const R& r) -> Value { return uint64_t{r.peer->max_staleness}; }},
      {"first_start", [](const R& r) -> Value { return r.peer->first_start; }},
      {"last_end", [](const R& r) -> Value { return r.peer->last_end; }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"peer", true, [](const R& r) { return str(r.peer->peer); }},
      {"iterations", true, [](const R& r) { return str(r.peer->iterations); }},
      {"skipped", true, [](const R& r) { return str(r.peer->skipped); }},
      {"exchanges", true, [](const R& r) { return str(r.peer->exchanges); }},
      {"bytes_sent", true, [](const R& r) { return str(r.peer->bytes_sent); }},
      {"bytes_received", true, [](const R& r) { return str(r.peer->bytes_received); }},
      {"compute_s", true, [](const R& r) { return fixed(r.peer->compute_s, 2); }},
      {"comm_s", true, [](const R& r) { return fixed(r.peer->comm_s, 2); }},
      {"wait_s", true, [](const R& r) { return fixed(r.peer->wait_s, 2); }},
      {"mean_staleness", true, [](const R& r) { return fixed(r.peer->mean_staleness, 2); }},
      {"max_staleness", true, [](const R& r) { return str(r.peer->max_staleness); }},
      {"first_start", true, [](const R& r) { return fixed(r.peer->first_start, 2); }},
      {"last_end", true, [](const R& r) { return fixed(r.peer->last_end, 2); }},
  };
  return render(rows, format, kFields, kColumns);
}

std::string formatPeerEvals(const std::vector<PeerEvalRecord>& rows, Format format) {
  using R = PeerEvalRecord;
  // A NaN accuracy (a regression) is "no accuracy".
  static constexpr auto accuracy = [](const R& r) {
    return std::isnan(r.accuracy) ? std::nullopt : std::optional<double>(r.accuracy);
  };
  static const std::vector<Field<R>> kFields = {
      {"run_id", [](const R& r) -> Value { return r.run_id; }},
      {"time_s", [](const R& r) -> Value { return r.time_s; }},
      {"iterations", [](const R& r) -> Value { return r.iterations; }},
      {"peers_averaged", [](const R& r) -> Value { return uint64_t{r.peers_averaged}; }},
      {"accuracy", [](const R& r) -> Value { return optionalValue(accuracy(r)); }},
      {"loss", [](const R& r) -> Value { return r.loss; }},
  };
  static const std::vector<Column<R>> kColumns = {
      {"time", true, [](const R& r) { return fixed(r.time_s, 2); }},
      {"iterations", true, [](const R& r) { return str(r.iterations); }},
      {"peers_averaged", true, [](const R& r) { return str(r.peers_averaged); }},
      {"accuracy", true, [](const R& r) { return percent(accuracy(r)); }},
      {"loss", true,
       [](const R& r) { return std::isnan(r.loss) ? std::string("-") : fixed(r.loss, 4); }},
  };
  return render(rows, format, kFields, kColumns);
}

}  // namespace fedfleet::history
