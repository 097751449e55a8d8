#include "common/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "common/compress/codec_spec.h"
#include "common/compress/error_feedback.h"
#include "common/data/dataset.h"      // kMaxClasses (a constant: no link)
#include "common/data/image_codec.h"  // kMaxImageSide (a constant: no link)
#include "common/wire/messages.h"     // DecodeLimits, kMaxNeighbours (constants: no link)

namespace fedfleet::config {
namespace {

// Calls f("section.key", member) for every field, in documentation order. The one list of keys.
// f takes the key as a std::string_view of a literal, so walking the list allocates nothing.
template <typename C, typename F>
void forEachField(C& c, F&& f) {
  f("run.name", c.run.name);
  f("run.seed", c.run.seed);
  f("run.rounds", c.run.rounds);
  f("run.target_accuracy", c.run.target_accuracy);
  f("coordinator.bind", c.coordinator.bind);
  f("coordinator.insecure", c.coordinator.insecure);
  f("coordinator.keys_dir", c.coordinator.keys_dir);
  f("coordinator.allow_dir", c.coordinator.allow_dir);
  f("coordinator.min_clients", c.coordinator.min_clients);
  f("coordinator.clients_per_round", c.coordinator.clients_per_round);
  f("coordinator.quorum", c.coordinator.quorum);
  f("coordinator.deadline_s", c.coordinator.deadline_s);
  f("coordinator.liveness_s", c.coordinator.liveness_s);
  f("coordinator.wait_clients_s", c.coordinator.wait_clients_s);
  f("coordinator.max_failed_rounds", c.coordinator.max_failed_rounds);
  f("coordinator.sample_from", c.coordinator.sample_from);
  f("coordinator.server_lr", c.coordinator.server_lr);
  f("coordinator.checkpoint_every", c.coordinator.checkpoint_every);
  f("coordinator.keep_checkpoints", c.coordinator.keep_checkpoints);
  f("coordinator.keep_best", c.coordinator.keep_best);
  f("coordinator.chunk_kib", c.coordinator.chunk_kib);
  f("coordinator.resume", c.coordinator.resume);
  f("coordinator.resume_changes", c.coordinator.resume_changes);
  f("coordinator.threads", c.coordinator.threads);
  f("coordinator.codec", c.coordinator.codec);
  f("coordinator.slow_link_codec", c.coordinator.slow_link_codec);
  f("coordinator.slow_link_mbps", c.coordinator.slow_link_mbps);
  f("coordinator.partial_buffer_mib", c.coordinator.partial_buffer_mib);
  f("coordinator.eval_every", c.coordinator.eval_every);
  f("coordinator.fed_eval_every", c.coordinator.fed_eval_every);
  f("coordinator.fed_eval_clients", c.coordinator.fed_eval_clients);
  f("coordinator.max_concurrent_uploads", c.coordinator.max_concurrent_uploads);
  f("coordinator.max_message_mib", c.coordinator.max_message_mib);
  f("coordinator.max_unauthenticated", c.coordinator.max_unauthenticated);
  f("coordinator.max_unauthenticated_per_host", c.coordinator.max_unauthenticated_per_host);
  f("coordinator.handshake_timeout_s", c.coordinator.handshake_timeout_s);
  f("coordinator.max_connections_per_key", c.coordinator.max_connections_per_key);
  f("coordinator.upload_idle_s", c.coordinator.upload_idle_s);
  f("coordinator.max_samples_per_update", c.coordinator.max_samples_per_update);
  f("policy.mode", c.policy.mode);
  f("policy.deadline", c.policy.deadline);
  f("policy.deadline_percentile", c.policy.deadline_percentile);
  f("policy.deadline_window", c.policy.deadline_window);
  f("policy.deadline_slack", c.policy.deadline_slack);
  f("policy.over_selection", c.policy.over_selection);
  f("policy.partial_work", c.policy.partial_work);
  f("policy.adaptive_steps", c.policy.adaptive_steps);
  f("policy.adaptive_target", c.policy.adaptive_target);
  f("policy.adaptive_max_factor", c.policy.adaptive_max_factor);
  f("policy.async_concurrency", c.policy.async_concurrency);
  f("policy.async_buffer", c.policy.async_buffer);
  f("policy.max_staleness", c.policy.max_staleness);
  f("aggregation.method", c.aggregation.method);
  f("aggregation.trim_fraction", c.aggregation.trim_fraction);
  f("aggregation.clip_norm", c.aggregation.clip_norm);
  f("aggregation.server_optimizer", c.aggregation.server_optimizer);
  f("aggregation.server_momentum", c.aggregation.server_momentum);
  f("aggregation.beta1", c.aggregation.beta1);
  f("aggregation.beta2", c.aggregation.beta2);
  f("aggregation.tau", c.aggregation.tau);
  f("aggregation.buffer_mib", c.aggregation.buffer_mib);
  f("aggregation.norm_bound", c.aggregation.norm_bound);
  f("aggregation.norm_bound_action", c.aggregation.norm_bound_action);
  f("aggregation.norm_window", c.aggregation.norm_window);
  f("aggregation.norm_growth", c.aggregation.norm_growth);
  f("aggregation.quarantine_after", c.aggregation.quarantine_after);
  f("aggregation.quarantine_rounds", c.aggregation.quarantine_rounds);
  f("aggregation.weight_cap", c.aggregation.weight_cap);
  f("selection.selector", c.selection.selector);
  f("selection.explore_initial", c.selection.explore_initial);
  f("selection.explore_decay", c.selection.explore_decay);
  f("selection.explore_min", c.selection.explore_min);
  f("selection.alpha", c.selection.alpha);
  f("selection.preferred_duration_s", c.selection.preferred_duration_s);
  f("selection.cutoff", c.selection.cutoff);
  f("selection.pacer_window", c.selection.pacer_window);
  f("selection.pacer_step_s", c.selection.pacer_step_s);
  f("selection.expected_round_s", c.selection.expected_round_s);
  f("selection.recent_failure_rounds", c.selection.recent_failure_rounds);
  f("model.name", c.model.name);
  f("model.path", c.model.path);
  f("model.init", c.model.init);
  f("model.local", c.model.local);
  f("data.dataset", c.data.dataset);
  f("data.format", c.data.format);
  f("data.dir", c.data.dir);
  f("data.path", c.data.path);
  f("data.labels_path", c.data.labels_path);
  f("data.test_path", c.data.test_path);
  f("data.test_labels_path", c.data.test_labels_path);
  f("data.label_column", c.data.label_column);
  f("data.task", c.data.task);
  f("data.feature_columns", c.data.feature_columns);
  f("data.num_classes", c.data.num_classes);
  f("data.image_channels", c.data.image_channels);
  f("data.image_size", c.data.image_size);
  f("data.normalize", c.data.normalize);
  f("data.mean", c.data.mean);
  f("data.std", c.data.stddev);
  f("data.holdout_fraction", c.data.holdout_fraction);
  f("data.partition", c.data.partition);
  f("data.alpha", c.data.alpha);
  f("data.labels_per_client", c.data.labels_per_client);
  f("data.shards_per_client", c.data.shards_per_client);
  f("data.synthetic_alpha", c.data.synthetic_alpha);
  f("data.synthetic_beta", c.data.synthetic_beta);
  f("data.synthetic_iid", c.data.synthetic_iid);
  f("data.synthetic_dim", c.data.synthetic_dim);
  f("data.max_samples", c.data.max_samples);
  f("data.eval_devices", c.data.eval_devices);
  f("data.partitions", c.data.partitions);
  f("data.train_subset", c.data.train_subset);
  f("data.test_subset", c.data.test_subset);
  f("train.epochs", c.train.epochs);
  f("train.steps", c.train.steps);
  f("train.batch", c.train.batch);
  f("train.lr", c.train.lr);
  f("train.momentum", c.train.momentum);
  f("train.optimizer", c.train.optimizer);
  f("train.loss", c.train.loss);
  f("train.weight_decay", c.train.weight_decay);
  f("train.prox_mu", c.train.prox_mu);
  f("client.coordinator", c.client.coordinator);
  f("client.id", c.client.id);
  f("client.keys_dir", c.client.keys_dir);
  f("client.device", c.client.device);
  f("client.threads", c.client.threads);
  f("client.partition", c.client.partition);
  f("client.heartbeat_s", c.client.heartbeat_s);
  f("client.exit_idle_s", c.client.exit_idle_s);
  f("client.upload_mbps", c.client.upload_mbps);
  f("client.upload_burst_kib", c.client.upload_burst_kib);
  f("client.upload_pipelined", c.client.upload_pipelined);
  f("client.compress_on_gpu", c.client.compress_on_gpu);
  f("client.residual_storage", c.client.residual_storage);
  f("client.local_state", c.client.local_state);
  f("client.scaffold_state", c.client.scaffold_state);
  f("client.scaffold_storage", c.client.scaffold_storage);
  f("client.served_model_path", c.client.served_model_path);
  f("client.local_dp_min_noise", c.client.local_dp_min_noise);
  f("sim.clients", c.sim.clients);
  f("sim.fleet", c.sim.fleet);
  f("sim.availability", c.sim.availability);
  f("sim.online_hours", c.sim.online_hours);
  f("sim.dropout", c.sim.dropout);
  f("sim.rejoin_s", c.sim.rejoin_s);
  f("sim.reference_gflops", c.sim.reference_gflops);
  f("sim.workers", c.sim.workers);
  f("sim.progress", c.sim.progress);
  f("sim.residual_storage", c.sim.residual_storage);
  f("sim.coordinator_ingress_mbps", c.sim.coordinator_ingress_mbps);
  f("sim.stragglers", c.sim.stragglers);
  f("sim.attackers", c.sim.attackers);
  f("sim.attack", c.sim.attack);
  f("sim.straggler_mode", c.sim.straggler_mode);
  f("sim.device", c.sim.device);
  f("sim.precision", c.sim.precision);
  f("sim.batch_clients", c.sim.batch_clients);
  f("sim.slow_fraction", c.sim.slow_fraction);
  f("sim.slow_factor", c.sim.slow_factor);
  f("sim.slowdown_probability", c.sim.slowdown_probability);
  f("sim.slowdown_factor", c.sim.slowdown_factor);
  f("sim.slowdown_s", c.sim.slowdown_s);
  f("sim.peer_fail_at", c.sim.peer_fail_at);
  f("sim.peer_failures", c.sim.peer_failures);
  f("decentralized.algorithm", c.decentralized.algorithm);
  f("decentralized.peers", c.decentralized.peers);
  f("decentralized.iterations", c.decentralized.iterations);
  f("decentralized.time_budget_s", c.decentralized.time_budget_s);
  f("decentralized.eval_every_s", c.decentralized.eval_every_s);
  f("decentralized.pipeline", c.decentralized.pipeline);
  f("decentralized.codec", c.decentralized.codec);
  f("decentralized.topology", c.decentralized.topology);
  f("decentralized.degree", c.decentralized.degree);
  f("decentralized.group_size", c.decentralized.group_size);
  f("decentralized.group_buffer", c.decentralized.group_buffer);
  f("decentralized.hop_bound", c.decentralized.hop_bound);
  f("decentralized.hop_backup", c.decentralized.hop_backup);
  f("decentralized.local_steps", c.decentralized.local_steps);
  f("decentralized.outer_lr", c.decentralized.outer_lr);
  f("decentralized.outer_momentum", c.decentralized.outer_momentum);
  f("decentralized.steps_per_iteration", c.decentralized.steps_per_iteration);
  f("decentralized.mbps", c.decentralized.mbps);
  f("decentralized.latency_ms", c.decentralized.latency_ms);
  f("history.db", c.history.db);
  f("metrics.port", c.metrics.port);
  f("metrics.bind", c.metrics.bind);
  f("blocks.count", c.blocks.count);
  f("blocks.rounds_per_block", c.blocks.rounds_per_block);
  f("blocks.block_s", c.blocks.block_s);
  f("blocks.anchor_s", c.blocks.anchor_s);
  f("blocks.mode", c.blocks.mode);
  f("blocks.skew", c.blocks.skew);
  f("blocks.overlap", c.blocks.overlap);
  f("blocks.validation_samples", c.blocks.validation_samples);
  f("blocks.test_samples", c.blocks.test_samples);
  f("blocks.synthetic_shift", c.blocks.synthetic_shift);
  f("limits.events_per_client_round", c.limits.events_per_client_round);
  f("limits.max_loss", c.limits.max_loss);
  f("limits.events_burst", c.limits.events_burst);
  f("limits.events_every_s", c.limits.events_every_s);
  f("dp.mode", c.dp.mode);
  f("dp.noise_multiplier", c.dp.noise_multiplier);
  f("dp.clip_norm", c.dp.clip_norm);
  f("dp.adaptive_clip", c.dp.adaptive_clip);
  f("dp.target_quantile", c.dp.target_quantile);
  f("dp.clip_lr", c.dp.clip_lr);
  f("dp.count_stddev", c.dp.count_stddev);
  f("dp.delta", c.dp.delta);
  f("dp.target_epsilon", c.dp.target_epsilon);
  f("dp.population", c.dp.population);
  f("secagg.mode", c.secagg.mode);
  f("secagg.neighbours", c.secagg.neighbours);
  f("secagg.threshold", c.secagg.threshold);
  f("secagg.clip_range", c.secagg.clip_range);
  f("secagg.quant_range", c.secagg.quant_range);
  f("secagg.stage_timeout_s", c.secagg.stage_timeout_s);
}

// The keys naming files a run reads (a config file's relative values are resolved against
// the file's folder; docs: README "Config reference").
std::vector<std::pair<std::string_view, std::string*>> inputPathFields(Config& c) {
  return {{"model.path", &c.model.path},
          {"model.init", &c.model.init},
          {"data.dir", &c.data.dir},
          {"data.path", &c.data.path},
          {"data.labels_path", &c.data.labels_path},
          {"data.test_path", &c.data.test_path},
          {"data.test_labels_path", &c.data.test_labels_path}};
}

template <typename T>
std::string typeName() {
  if constexpr (kIsChoice<T>)
    return "one of " + T::list();
  else if constexpr (std::is_same_v<T, bool>)
    return "a boolean";
  else if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return "an array of strings";
  else if constexpr (std::is_same_v<T, std::vector<uint32_t>>)
    return "a non-negative integer or an array of them";
  else if constexpr (std::is_same_v<T, std::vector<double>>)
    return "an array of numbers";
  else if constexpr (std::is_floating_point_v<T>)
    return "a number";
  else if constexpr (std::is_unsigned_v<T>)
    return "a non-negative integer";
  else
    return "an integer";
}

std::string nodeTypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    default:
      return "a date or time";
  }
}

// Assigns a TOML value to a field, checking type and range.
template <typename T>
Status assign(const toml::node& node, T& out, const std::string& key) {
  auto wrongType = [&] {
    return invalidArgument("'" + key + "' must be " + typeName<T>() + ", got " +
                           nodeTypeName(node));
  };
  if constexpr (kIsChoice<T>) {
    auto v = node.value_exact<std::string>();
    if (!v) return wrongType();
    auto value = T::parse(*v);
    if (!value) {
      return invalidArgument("'" + key + "' must be one of " + T::list() + "; got \"" + *v + "\"");
    }
    out = *value;
  } else if constexpr (std::is_same_v<T, bool>) {
    auto v = node.value_exact<bool>();
    if (!v) return wrongType();
    out = *v;
  } else if constexpr (std::is_same_v<T, std::string>) {
    auto v = node.value_exact<std::string>();
    if (!v) return wrongType();
    out = *v;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    const toml::array* array = node.as_array();
    if (!array) return wrongType();
    std::vector<std::string> values;
    for (const toml::node& item : *array) {
      auto v = item.value_exact<std::string>();
      if (!v) {
        return invalidArgument("'" + key +
                               "' must be an array of strings, got an element that is " +
                               nodeTypeName(item));
      }
      values.push_back(*v);
    }
    out = std::move(values);
  } else if constexpr (std::is_same_v<T, std::vector<uint32_t>>) {
    // data.image_size, the one field of this type: an integer n stands for [n, n].
    const toml::array* array = node.as_array();
    if (!array && !node.is_integer()) return wrongType();
    std::vector<uint32_t> values;
    for (size_t i = 0; i < (array ? array->size() : 1); ++i) {
      const toml::node& item = array ? *array->get(i) : node;
      if (!item.is_integer()) {
        return invalidArgument("'" + key + "' must be " + typeName<T>() +
                               ", got an element that is " + nodeTypeName(item));
      }
      uint32_t v = 0;
      FEDFLEET_RETURN_IF_ERROR(assign(item, v, key));
      values.push_back(v);
    }
    if (!array) values.push_back(values.front());
    out = std::move(values);
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    const toml::array* array = node.as_array();
    if (!array) return wrongType();
    std::vector<double> values;
    for (const toml::node& item : *array) {
      double v = 0;
      FEDFLEET_RETURN_IF_ERROR(assign(item, v, key));
      values.push_back(v);
    }
    out = std::move(values);
  } else if constexpr (std::is_floating_point_v<T>) {
    auto v = node.value<double>();  // accepts integers too
    if (!v || node.is_boolean()) return wrongType();
    if (!std::isfinite(*v)) return invalidArgument("'" + key + "' must be finite");
    out = static_cast<T>(*v);
  } else {
    auto v = node.value_exact<int64_t>();
    if (!v) return wrongType();
    if (std::is_unsigned_v<T> && *v < 0) {
      return invalidArgument("'" + key + "' must not be negative, got " + std::to_string(*v));
    }
    if (static_cast<uint64_t>(*v) > static_cast<uint64_t>(std::numeric_limits<T>::max()) &&
        *v > 0) {
      return invalidArgument("'" + key + "' is too large: " + std::to_string(*v));
    }
    out = static_cast<T>(*v);
  }
  return Status::ok();
}

std::string where(const toml::node& node, const std::string& origin) {
  const auto& src = node.source();
  std::ostringstream s;
  s << origin;
  if (src.begin.line > 0) s << ":" << src.begin.line;
  return s.str();
}

// Edit distance between two keys (Levenshtein: insertions, deletions, substitutions).
size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'x'?)" naming the candidate closest to `wrong`, or "" when none is close: a
// candidate counts when at most a third of its letters (at least 2) differ, or when `wrong`'s
// part after the dot is exactly a candidate's (a key put in the wrong section).
std::string didYouMean(std::string_view wrong, const std::vector<std::string>& candidates) {
  const std::string_view leaf = wrong.substr(wrong.find('.') + 1);
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t dot = c.find('.');
    if (dot != std::string::npos && wrong.find('.') != std::string_view::npos &&
        std::string_view(c).substr(dot + 1) == leaf) {
      return " (did you mean '" + c + "'?)";
    }
    const size_t d = editDistance(wrong, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  if (best.empty() || best_distance > std::max<size_t>(2, best.size() / 3)) return "";
  return " (did you mean '" + best + "'?)";
}

// The section names ("aggregation", "blocks", ...), sorted; built once.
const std::set<std::string, std::less<>>& sectionNames() {
  static const std::set<std::string, std::less<>> names = [] {
    std::set<std::string, std::less<>> out;
    Config c;
    forEachField(c,
                 [&](std::string_view key, auto&) { out.emplace(key.substr(0, key.find('.'))); });
    return out;
  }();
  return names;
}

Status applyTable(Config& config, const toml::table& root, const std::string& origin) {
  const std::set<std::string, std::less<>>& sections = sectionNames();
  for (const auto& [section_key, section_node] : root) {
    std::string section(section_key.str());
    if (!sections.count(section)) {
      std::string known;
      for (const std::string& name : sections) known += (known.empty() ? "" : ", ") + name;
      const std::string hint =
          didYouMean(section, std::vector<std::string>(sections.begin(), sections.end()));
      return invalidArgument(where(section_node, origin) + ": unknown section '" + section + "'" +
                             (hint.empty() ? " (known: " + known + ")" : hint));
    }
    const toml::table* table = section_node.as_table();
    if (!table) {
      return invalidArgument(where(section_node, origin) + ": '" + section +
                             "' must be a table ([" + section + "])");
    }
    for (const auto& entry : *table) {
      // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
      const toml::node& value = entry.second;
      std::string key = section + "." + std::string(entry.first.str());
      bool found = false;
      Status status;
      forEachField(config, [&](std::string_view name, auto& member) {
        if (found || name != key) return;
        found = true;
        status = assign(value, member, key);
      });
      if (!found) {
        return invalidArgument(where(value, origin) + ": unknown key '" + key + "'" +
                               didYouMean(key, Config::keys()));
      }
      if (!status.isOk()) return status.withContext(where(value, origin));
    }
  }
  return Status::ok();
}

// "must be one of a, b, c; got "x"" when `value` is not in `names`.
// A ZeroMQ endpoint a socket can bind: tcp://HOST:PORT, where HOST is a name, an IPv4 address,
// a bracketed IPv6 address or * (every interface) and PORT is 1-65535 or * (the system picks
// one), or ipc://PATH. Anything else is kInvalidArgument naming `key`.
Status checkBindEndpoint(const std::string& key, const std::string& endpoint) {
  const std::string expected = "'" + key +
                               "' must be a ZeroMQ endpoint tcp://HOST:PORT (PORT 1-65535 or *) "
                               "or ipc://PATH; got \"" +
                               endpoint + "\"";
  const std::string_view e = endpoint;
  if (e.substr(0, 6) == "ipc://") {
    if (e.size() == 6) return invalidArgument(expected + " (no path)");
    return Status::ok();
  }
  if (e.substr(0, 6) != "tcp://") return invalidArgument(expected);
  const std::string_view address = e.substr(6);
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return invalidArgument(expected + " (no port)");
  const std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
  if (host.empty() || (!bracketed && host.find_first_of(":[] \t") != std::string_view::npos)) {
    return invalidArgument(expected + " (bad host)");
  }
  if (port == "*") return Status::ok();
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string_view::npos) {
    return invalidArgument(expected + " (the port is a number from 1 to 65535, or *)");
  }
  const int number = std::stoi(std::string(port));
  if (number < 1 || number > 65535) {
    return invalidArgument(expected + " (port " + std::string(port) +
                           " is outside the range 1-65535)");
  }
  return Status::ok();
}

Status oneOf(const std::string& key, const std::string& value,
             std::initializer_list<const char*> names) {
  std::string list;
  for (const char* n : names) {
    if (value == n) return Status::ok();
    list += (list.empty() ? "" : ", ") + std::string(n);
  }
  return invalidArgument("'" + key + "' must be one of " + list + "; got \"" + value + "\"");
}

}  // namespace

Status Config::loadString(const std::string& toml_text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
      << e.description();
    return invalidArgument(s.str());
  }
  return applyTable(*this, root, origin);
}

Status Config::loadFile(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << path << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
      << e.description();
    return invalidArgument(s.str());
  }
  FEDFLEET_RETURN_IF_ERROR(applyTable(*this, root, path));
  // The files a config file names (its model, its data, its fleet) are found next to it, as a
  // reader of the file expects, wherever the program was started.
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  auto relative = [&](std::string_view section, std::string_view key, std::string& value) {
    const toml::node* node = root.at_path(std::string(section) + "." + std::string(key)).node();
    if (!node || value.empty() || std::filesystem::path(value).is_absolute()) return;
    value = (base / value).lexically_normal().string();
  };
  for (auto& [key, member] : inputPathFields(*this)) {
    relative(key.substr(0, key.find('.')), key.substr(key.find('.') + 1), *member);
  }
  if (sim.fleet.find('/') != std::string::npos || sim.fleet.ends_with(".csv")) {
    relative("sim", "fleet", sim.fleet);
  }
  return Status::ok();
}

Status Config::loadJson(const nlohmann::json& json, const std::string& origin) {
  if (!json.is_object()) return invalidArgument(origin + ": not a JSON object of sections");
  // As TOML text, so that the one set of type and range checks applies: a JSON boolean,
  // number, string (its escapes are TOML's) or array of them is written as TOML writes it.
  // Keys this build no longer has (a history written by an older one) are passed over.
  const std::vector<std::string> known = keys();
  std::string text;
  for (const auto& [section, entries] : json.items()) {
    if (!entries.is_object()) return invalidArgument(origin + ": '" + section + "' is not a table");
    text += "[" + section + "]\n";
    for (const auto& [key, value] : entries.items()) {
      if (std::find(known.begin(), known.end(), section + "." + key) == known.end()) continue;
      if (value.is_null() || value.is_object()) {
        return invalidArgument(origin + ": '" + section + "." + key + "' holds " +
                               value.type_name() + ", which no key takes");
      }
      text += key + " = " + value.dump() + "\n";
    }
  }
  return loadString(text, origin);
}

Status Config::set(const std::string& assignment) {
  auto eq = assignment.find('=');
  auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    return invalidArgument("override '" + assignment + "' must look like section.key=value");
  }
  std::string section = assignment.substr(0, dot);
  std::string key = assignment.substr(dot + 1, eq - dot - 1);
  std::string value = assignment.substr(eq + 1);
  std::string text = "[" + section + "]\n" + key + " = " + value + "\n";
  Status st = loadString(text, "--set " + assignment);
  if (!st.isOk() && !value.empty() && value.front() != '"') {
    // A bare word such as `cnn` or `tcp://...`: take it as a string.
    std::string quoted = "\"";
    for (char ch : value) {
      if (ch == '\\' || ch == '"') quoted.push_back('\\');
      quoted.push_back(ch);
    }
    quoted += "\"";
    Status as_string =
        loadString("[" + section + "]\n" + key + " = " + quoted + "\n", "--set " + assignment);
    if (as_string.isOk()) return as_string;
    // Not TOML, and not a string either: say what the key takes (or that it is unknown) rather
    // than what the TOML parser expected at the first letter.
    std::string expected;
    Config probe;
    forEachField(probe, [&](std::string_view name, auto& member) {
      if (name == section + "." + key) expected = typeName<std::decay_t<decltype(member)>>();
    });
    if (expected.empty()) return as_string;  // unknown key, with its "did you mean"
    return invalidArgument("--set " + assignment + ": '" + section + "." + key + "' must be " +
                           expected + "; got " + value);
  }
  return st;
}

data::DataFormat Config::dataFormat() const {
  using K = DataFormatKey;
  using F = data::DataFormat;
  switch (data.format != K::kUnset ? data.format.value() : data.dataset.value()) {
    case K::kUnset:
    case K::kFashionMnist:
      return F::kFashionMnist;
    case K::kIdx:
      return F::kIdx;
    case K::kCsv:
      return F::kCsv;
    case K::kTensors:
      return F::kTensors;
    case K::kImageFolder:
      return F::kImageFolder;
    case K::kSynthetic:
      return F::kSynthetic;
  }
  return F::kFashionMnist;
}

std::string Config::dataFormatName() const {
  const Choice<DataFormatKey> key =
      data.format != DataFormatKey::kUnset ? data.format : data.dataset;
  return key == DataFormatKey::kUnset ? "fashion-mnist" : std::string(key.name());
}

uint32_t Config::minClients() const {
  return coordinator.min_clients > 0 ? coordinator.min_clients : coordinator.clients_per_round;
}

uint32_t Config::quorum() const {
  return coordinator.quorum > 0 ? coordinator.quorum : (coordinator.clients_per_round + 1) / 2;
}

uint32_t Config::partitions() const { return data.partitions > 0 ? data.partitions : minClients(); }

std::string Config::allowDir() const {
  return coordinator.allow_dir.empty() ? coordinator.keys_dir + "/clients" : coordinator.allow_dir;
}

uint64_t Config::honestClientFrameBytes() const {
  // Room for the message around a payload (a Chunk's fields, a Hello, Cap'n Proto's framing).
  constexpr uint64_t kMessageRoom = 64 << 10;
  // A Chunk: at most chunk_kib KiB of values, dense fp32 or masked uint32 (every codec writes
  // fewer bytes), after a 12-byte codec header (common/compress/payload.h).
  const uint64_t chunk = uint64_t{coordinator.chunk_kib} * 1024 + kMessageRoom;
  if (secagg.mode == SecAggMode::kNone) return chunk;
  // Secure aggregation: a client's largest message is its sealed shares, one per neighbour, each
  // under 256 bytes with its list entry (secagg::kSealedSharesBytes of sealed data). 0
  // neighbours: 2 ceil(log2 n), at most 64.
  const uint64_t k =
      secagg.neighbours == 0 ? 64 : std::min<uint64_t>(secagg.neighbours, secagg::kMaxNeighbours);
  return std::max(chunk, (k + 1) * 256 + kMessageRoom);
}

uint64_t Config::clientFrameLimitBytes() const {
  if (coordinator.max_message_mib > 0) return uint64_t{coordinator.max_message_mib} << 20;
  constexpr uint64_t kMib = 1 << 20;
  return (honestClientFrameBytes() + kMib - 1) / kMib * kMib;
}

Status Config::validateDataSource() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return invalidArgument("'" + key + "' " + why);
  };
  if (data.dataset != DataFormatKey::kFashionMnist && data.dataset != DataFormatKey::kSynthetic) {
    return bad("data.dataset",
               "must be \"fashion-mnist\" or \"synthetic\" (or set data.format), "
               "got \"" +
                   choiceName(data.dataset) + "\"");
  }
  const data::DataFormat f = dataFormat();
  const std::string format = dataFormatName();
  if (data.format != DataFormatKey::kUnset && data.dataset != DataFormatKey::kFashionMnist &&
      data.dataset != data.format) {
    return bad("data.dataset", "(\"" + choiceName(data.dataset) + "\") and data.format (\"" +
                                   choiceName(data.format) + "\") disagree: set data.format alone");
  }
  const bool files = readsDataFiles();
  // Keys a format does not read are refused rather than ignored.
  auto unused = [&](const char* key, bool set) -> Status {
    if (!set) return Status::ok();
    return bad(key, "is not read with data.format = \"" + format + "\"");
  };
  FEDFLEET_RETURN_IF_ERROR(unused("data.path", !files && !data.path.empty()));
  FEDFLEET_RETURN_IF_ERROR(unused("data.test_path", !files && !data.test_path.empty()));
  FEDFLEET_RETURN_IF_ERROR(
      unused("data.labels_path", f != data::DataFormat::kIdx && !data.labels_path.empty()));
  FEDFLEET_RETURN_IF_ERROR(unused("data.test_labels_path",
                                  f != data::DataFormat::kIdx && !data.test_labels_path.empty()));
  FEDFLEET_RETURN_IF_ERROR(
      unused("data.feature_columns", f != data::DataFormat::kCsv && !data.feature_columns.empty()));
  FEDFLEET_RETURN_IF_ERROR(
      unused("data.label_column", f != data::DataFormat::kCsv && data.label_column != "label"));
  FEDFLEET_RETURN_IF_ERROR(unused("data.image_channels",
                                  f != data::DataFormat::kImageFolder && data.image_channels != 1));
  FEDFLEET_RETURN_IF_ERROR(
      unused("data.image_size", f != data::DataFormat::kImageFolder && !data.image_size.empty()));
  FEDFLEET_RETURN_IF_ERROR(unused("data.holdout_fraction", !files && data.holdout_fraction != 0));
  if (data.normalize != Normalization::kNone && (!files || f == data::DataFormat::kIdx)) {
    return bad("data.normalize",
               "applies to csv, tensors and image-folder data (Fashion-MNIST and IDX images are "
               "scaled to [0, 1] as they are batched); got data.format = \"" +
                   format + "\"");
  }
  if (data.normalize == Normalization::kFixed) {
    if (data.mean.empty() || data.mean.size() != data.stddev.size()) {
      return bad("data.normalize",
                 "\"fixed\" needs data.mean and data.std of the same length (one value per "
                 "channel, or one for all)");
    }
    for (double v : data.stddev) {
      if (!(v > 0)) return bad("data.std", "every value must be > 0");
    }
  } else if (!data.mean.empty() || !data.stddev.empty()) {
    return bad("data.mean",
               "and data.std are read only with data.normalize = \"fixed\" (\"computed\" "
               "records the values it computes there)");
  }
  FEDFLEET_RETURN_IF_ERROR(unused("data.dir", files && !data.dir.empty()));
  if (data.task == DataTask::kRegression) {
    if (f != data::DataFormat::kCsv && f != data::DataFormat::kTensors) {
      return bad("data.task",
                 "\"regression\" reads float targets from csv (the label column) or tensors (a "
                 "float \"y\") files; data.format = \"" +
                     format + "\" holds class labels");
    }
    if (data.partition != PartitionScheme::kIid && data.partition != PartitionScheme::kQuantity &&
        data.partition != PartitionScheme::kNone && data.partition != PartitionScheme::kFiles) {
      return bad("data.partition",
                 "\"" + choiceName(data.partition) +
                     "\" splits by class label; regression data splits iid, by quantity, or by "
                     "files (or none: each client its own)");
    }
    if (data.num_classes != 0) {
      return bad("data.num_classes", "is for class labels; regression data has none (set 0)");
    }
    if (blocks.count > 0) {
      return bad("blocks.count", "block-cyclic data is cut by class; regression data has none");
    }
    if (run.target_accuracy > 0) {
      return bad("run.target_accuracy",
                 "a regression has no accuracy to reach (set 0; the test loss is its figure)");
    }
  }
  if (!files) return Status::ok();
  // data.partition = "none": a client process names its own file (data.path) and a coordinator
  // its test file (data.test_path); each program checks for the one it reads.
  const bool own = data.partition == PartitionScheme::kNone;
  if (data.path.empty() && !own)
    return bad("data.path", "is required with data.format = \"" + format + "\"");
  if (f == data::DataFormat::kIdx && !data.path.empty() && data.labels_path.empty()) {
    return bad("data.labels_path", "is required with data.format = \"idx\" (the IDX label file)");
  }
  if (f == data::DataFormat::kIdx && !data.test_path.empty() && data.test_labels_path.empty()) {
    return bad("data.test_labels_path", "is required when data.test_path names IDX test images");
  }
  if (!(data.holdout_fraction >= 0 && data.holdout_fraction < 1)) {
    return bad("data.holdout_fraction", "must be in [0, 1)");
  }
  if (data.test_path.empty() && data.holdout_fraction == 0 && !own) {
    return bad("data.test_path",
               "or data.holdout_fraction is needed: the server evaluates on a "
               "test file, or on a held-out share of the training file");
  }
  if (!data.test_path.empty() && data.holdout_fraction != 0) {
    return bad("data.holdout_fraction", "must be 0 when data.test_path names a test file");
  }
  if (f == data::DataFormat::kCsv && data.label_column.empty()) {
    return bad("data.label_column", "must name the label column");
  }
  if (data.image_channels != 1 && data.image_channels != 3) {
    return bad("data.image_channels",
               "must be 1 (grey) or 3 (RGB), got " + std::to_string(data.image_channels));
  }
  if (!data.image_size.empty()) {
    const uint32_t max = data::kMaxImageSide;
    const auto& size = data.image_size;
    if (size.size() != 2 || size[0] == 0 || size[1] == 0 || size[0] > max || size[1] > max) {
      return bad("data.image_size", "must be [rows, cols] or one integer n ([n, n]), each 1 to " +
                                        std::to_string(max));
    }
  }
  return Status::ok();
}

Status Config::validate() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return invalidArgument("'" + key + "' " + why);
  };
  if (run.rounds == 0) return bad("run.rounds", "must be at least 1");
  if (limits.events_per_client_round == 0) {
    return bad("limits.events_per_client_round", "must be at least 1");
  }
  if (!(limits.max_loss > 0 && std::isfinite(limits.max_loss))) {
    return bad("limits.max_loss", "must be finite and > 0");
  }
  if (!(limits.events_burst >= 0 && std::isfinite(limits.events_burst))) {
    return bad("limits.events_burst",
               "must be a finite number of rows >= 0 (0: no budget in time)");
  }
  if (!(limits.events_every_s >= 0 && std::isfinite(limits.events_every_s))) {
    return bad("limits.events_every_s",
               "must be a finite number of seconds >= 0 (0: no budget in time)");
  }
  if (run.target_accuracy < 0 || run.target_accuracy > 1) {
    return bad("run.target_accuracy", "must be in [0, 1] (a fraction; 0: off)");
  }
  if (coordinator.clients_per_round == 0)
    return bad("coordinator.clients_per_round", "must be at least 1");
  if (quorum() > coordinator.clients_per_round) {
    return bad("coordinator.quorum", "(" + std::to_string(quorum()) +
                                         ") must not exceed coordinator.clients_per_round (" +
                                         std::to_string(coordinator.clients_per_round) + ")");
  }
  if (!(coordinator.deadline_s > 0)) return bad("coordinator.deadline_s", "must be > 0");
  if (!(coordinator.liveness_s > 0)) return bad("coordinator.liveness_s", "must be > 0");
  if (!(coordinator.wait_clients_s > 0)) return bad("coordinator.wait_clients_s", "must be > 0");
  if (coordinator.sample_from == SampleFrom::kPartitions &&
      partitions() < coordinator.clients_per_round) {
    return bad("data.partitions",
               "must be at least coordinator.clients_per_round when sampling partitions");
  }
  if (!(coordinator.server_lr > 0)) return bad("coordinator.server_lr", "must be > 0");
  if (coordinator.threads == 0) return bad("coordinator.threads", "must be at least 1");
  FEDFLEET_RETURN_IF_ERROR(checkBindEndpoint("coordinator.bind", coordinator.bind));
  if (auto spec = compress::parseCodecSpec(coordinator.codec); !spec.isOk()) {
    return bad("coordinator.codec", spec.status().message());
  }
  if (!coordinator.slow_link_codec.empty()) {
    if (auto spec = compress::parseCodecSpec(coordinator.slow_link_codec); !spec.isOk()) {
      return bad("coordinator.slow_link_codec", spec.status().message());
    }
    if (!(coordinator.slow_link_mbps > 0)) {
      return bad("coordinator.slow_link_mbps", "must be > 0 when slow_link_codec is set");
    }
  }
  if (coordinator.eval_every == 0) return bad("coordinator.eval_every", "must be at least 1");
  if (coordinator.slow_link_mbps < 0) return bad("coordinator.slow_link_mbps", "must be >= 0");
  if (!compress::parseResidualStorage(client.residual_storage).isOk()) {
    return bad("client.residual_storage", "must be fp32, bf16 or fp16");
  }
  if (!compress::parseResidualStorage(client.scaffold_storage).isOk()) {
    return bad("client.scaffold_storage", "must be fp32, bf16 or fp16");
  }
  if (!compress::parseResidualStorage(sim.residual_storage).isOk()) {
    return bad("sim.residual_storage", "must be fp32, bf16 or fp16");
  }
  if (client.upload_mbps < 0) return bad("client.upload_mbps", "must be >= 0 (0: unthrottled)");
  if (client.upload_burst_kib == 0 || client.upload_burst_kib > 1048576) {
    return bad("client.upload_burst_kib", "must be between 1 and 1048576");
  }
  if (!(coordinator.upload_idle_s >= 0) || !std::isfinite(coordinator.upload_idle_s)) {
    return bad("coordinator.upload_idle_s", "must be >= 0 seconds (0: never)");
  }
  if (coordinator.chunk_kib == 0 || coordinator.chunk_kib > 256 * 1024) {
    return bad("coordinator.chunk_kib", "must be between 1 and 262144");
  }
  constexpr uint64_t kMaxFrameMib = wire::DecodeLimits{}.max_bytes >> 20;
  if (coordinator.max_message_mib > kMaxFrameMib) {
    return bad("coordinator.max_message_mib",
               "must be between 1 and " + std::to_string(kMaxFrameMib) +
                   " (the wire decoder's frame limit), or 0 for what this config's clients send "
                   "(" +
                   std::to_string(clientFrameLimitBytes() >> 20) + " MiB now)");
  }
  if (honestClientFrameBytes() > clientFrameLimitBytes() ||
      clientFrameLimitBytes() > wire::DecodeLimits{}.max_bytes) {
    return bad("coordinator.max_message_mib",
               "must leave room for the largest frame a client sends (" +
                   std::to_string(honestClientFrameBytes()) +
                   " bytes: a chunk of coordinator.chunk_kib plus its header, or a "
                   "secure-aggregation message for secagg.neighbours); set it to 0 for exactly "
                   "that, or lower coordinator.chunk_kib");
  }
  if (coordinator.max_unauthenticated_per_host > coordinator.max_unauthenticated &&
      coordinator.max_unauthenticated > 0) {
    return bad("coordinator.max_unauthenticated_per_host",
               "must not exceed coordinator.max_unauthenticated (" +
                   std::to_string(coordinator.max_unauthenticated) + ")");
  }
  if (!(coordinator.handshake_timeout_s >= 0) || coordinator.handshake_timeout_s > 3600) {
    return bad("coordinator.handshake_timeout_s", "must be between 0 (no limit) and 3600 seconds");
  }
  static const char* kModels[] = {"logreg", "mlp", "cnn", "lenet", "torchscript"};
  bool model_ok = false;
  for (const char* m : kModels) model_ok |= model.name == m;
  if (!model_ok) {
    return bad("model.name",
               "must be one of logreg, mlp, cnn, lenet, torchscript; got \"" + model.name + "\"");
  }
  if (model.name == "torchscript" && model.path.empty()) {
    return bad("model.path", "is required when model.name = \"torchscript\"");
  }
  for (const std::string& pattern : model.local) {
    if (pattern.empty()) return bad("model.local", "holds an empty pattern");
  }
  if (!model.local.empty() && aggregation.method == AggregationMethod::kScaffold) {
    return bad("model.local",
               "cannot be used with aggregation.method = \"scaffold\": SCAFFOLD's control "
               "variates correct every parameter towards the global model");
  }
  FEDFLEET_RETURN_IF_ERROR(validateDataSource());
  if (data.partition == PartitionScheme::kFiles) {
    const data::DataFormat f = dataFormat();
    const std::string format = dataFormatName();
    if (f != data::DataFormat::kCsv && f != data::DataFormat::kTensors &&
        f != data::DataFormat::kImageFolder) {
      return bad("data.partition",
                 "\"files\" (one file per simulated client in the directory data.path) needs "
                 "data.format csv, tensors or image-folder; got \"" +
                     format + "\"");
    }
    if (data.test_path.empty()) {
      return bad("data.test_path",
                 "is required with data.partition = \"files\": the server's test set (the "
                 "clients' files are all training data)");
    }
    if (blocks.count > 0) {
      return bad("data.partition", "\"files\" cannot be cut into blocks");
    }
  }
  if (data.num_classes == 1 || data.num_classes > data::kMaxClasses) {
    return bad("data.num_classes",
               "must be 0 (from the data) or between 2 and " + std::to_string(data::kMaxClasses));
  }
  if (data.partition == PartitionScheme::kNone && blocks.count > 0) {
    return bad("data.partition",
               "\"none\" (each client trains the data it holds) cannot be "
               "cut into blocks: block-cyclic runs partition one data set");
  }
  if (data.shards_per_client == 0) return bad("data.shards_per_client", "must be at least 1");
  if (!(data.synthetic_alpha >= 0)) return bad("data.synthetic_alpha", "must be >= 0");
  if (!(data.synthetic_beta >= 0)) return bad("data.synthetic_beta", "must be >= 0");
  if (data.synthetic_dim == 0) return bad("data.synthetic_dim", "must be at least 1");
  if (data.eval_devices == 0) return bad("data.eval_devices", "must be at least 1");
  if (sim.clients == 0) return bad("sim.clients", "must be at least 1");
  if (sim.fleet.empty()) return bad("sim.fleet", "must not be empty");
  if (sim.online_hours < 0 || sim.online_hours > 24) {
    return bad("sim.online_hours", "must be in [0, 24] (0: each tier's own)");
  }
  if (sim.dropout >= 1 || (sim.dropout < 0 && sim.dropout != -1)) {
    return bad("sim.dropout", "must be in [0, 1), or -1 for each tier's own");
  }
  if (!(sim.rejoin_s >= 0)) return bad("sim.rejoin_s", "must be >= 0");
  if (!(sim.coordinator_ingress_mbps >= 0) || !std::isfinite(sim.coordinator_ingress_mbps)) {
    return bad("sim.coordinator_ingress_mbps",
               "must be a finite number of Mbit/s >= 0 (0: unlimited)");
  }
  if (!(sim.stragglers >= 0 && sim.stragglers <= 1))
    return bad("sim.stragglers", "must be in [0, 1]");
  if (!(sim.attackers >= 0 && sim.attackers <= 1)) {
    return bad("sim.attackers", "must be a fraction of the virtual clients in [0, 1]");
  }
  FEDFLEET_RETURN_IF_ERROR(oneOf("sim.precision", sim.precision, {"fp32", "bf16"}));
  if (!(sim.reference_gflops > 0)) return bad("sim.reference_gflops", "must be > 0");
  if (!(data.alpha > 0)) return bad("data.alpha", "must be > 0");
  if (data.labels_per_client == 0 || data.labels_per_client > 10) {
    return bad("data.labels_per_client", "must be between 1 and 10");
  }
  if (train.epochs == 0 && train.steps == 0)
    return bad("train.epochs", "or train.steps must be > 0");
  if (train.batch == 0) return bad("train.batch", "must be at least 1");
  if (!(train.lr > 0)) return bad("train.lr", "must be > 0");
  if (train.momentum < 0 || train.momentum >= 1) return bad("train.momentum", "must be in [0, 1)");
  if (train.weight_decay < 0) return bad("train.weight_decay", "must be >= 0");
  FEDFLEET_RETURN_IF_ERROR(oneOf("train.optimizer", train.optimizer, {"sgd", "adam", "adamw"}));
  FEDFLEET_RETURN_IF_ERROR(
      oneOf("train.loss", train.loss, {"cross_entropy", "mse", "bce", "module"}));
  if (train.loss == "cross_entropy" && data.task == DataTask::kRegression) {
    return bad("train.loss",
               "\"cross_entropy\" needs class labels; with data.task = \"regression\" use "
               "\"mse\" (or \"bce\" for targets in [0, 1])");
  }
  if (train.loss == "mse" && data.task != DataTask::kRegression) {
    return bad("train.loss",
               "\"mse\" needs float targets: set data.task = \"regression\" (csv or tensors "
               "data), or use \"cross_entropy\"");
  }
  if (train.loss == "module" && model.name != "torchscript") {
    return bad("train.loss",
               "\"module\" calls the TorchScript model's loss(output, target); model.name = \"" +
                   model.name + "\" is built in");
  }
  if (train.optimizer != "sgd" && train.momentum != 0) {
    return bad("train.momentum", "is SGD's; Adam and AdamW keep their own moments (set it to 0)");
  }
  if (train.optimizer != "sgd" && aggregation.method == AggregationMethod::kFedNova) {
    return bad("train.optimizer",
               "must be sgd with aggregation.method = \"fednova\" (FedNova normalises SGD steps)");
  }
  if (client.device != "auto" && client.device != "cpu" && client.device != "cuda") {
    return bad("client.device", "must be auto, cpu or cuda; got \"" + client.device + "\"");
  }
  if (client.threads == 0) return bad("client.threads", "must be at least 1");
  if (!(client.heartbeat_s > 0)) return bad("client.heartbeat_s", "must be > 0");
  if (client.exit_idle_s < 0) return bad("client.exit_idle_s", "must be >= 0");
  if (!(client.local_dp_min_noise >= 0 && std::isfinite(client.local_dp_min_noise))) {
    return bad("client.local_dp_min_noise", "must be a noise multiplier >= 0 (0: off)");
  }
  if (history.db.empty()) return bad("history.db", "must not be empty");
  if (metrics.port > 65535) return bad("metrics.port", "must be a TCP port (1-65535) or 0 (off)");
  if (metrics.bind.empty()) return bad("metrics.bind", "must not be empty");
  // A scheme has a '/', and NAME:PORT one ':' (an IPv6 address has at least two).
  if (metrics.bind.find_first_of("/ \t") != std::string::npos ||
      std::count(metrics.bind.begin(), metrics.bind.end(), ':') == 1) {
    return bad("metrics.bind",
               "must be a host address such as 127.0.0.1 or ::1, without a scheme "
               "or port (the port is metrics.port); got \"" +
                   metrics.bind + "\"");
  }
  if (train.prox_mu < 0) return bad("train.prox_mu", "must be >= 0");
  FEDFLEET_RETURN_IF_ERROR(validatePolicy());
  // Ranges of the selector's own parameters are checked where it is built
  // (engine::checkEngineOptions); the name is checked here.
  FEDFLEET_RETURN_IF_ERROR(validateBlocks());
  FEDFLEET_RETURN_IF_ERROR(validateDp());
  FEDFLEET_RETURN_IF_ERROR(validateSecAgg());
  FEDFLEET_RETURN_IF_ERROR(validateDecentralized());
  return validateAggregation();
}

Status Config::validateDecentralized() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return invalidArgument("'" + key + "' " + why);
  };
  const auto& s = sim;
  if (!(s.slow_fraction >= 0 && s.slow_fraction <= 1)) {
    return bad("sim.slow_fraction", "must be in [0, 1]");
  }
  if (!(s.slow_factor >= 1 && std::isfinite(s.slow_factor))) {
    return bad("sim.slow_factor", "must be finite and >= 1 (times slower)");
  }
  if (!(s.slowdown_probability >= 0 && s.slowdown_probability <= 1)) {
    return bad("sim.slowdown_probability", "must be in [0, 1]");
  }
  if (!(s.slowdown_factor >= 1 && std::isfinite(s.slowdown_factor))) {
    return bad("sim.slowdown_factor", "must be finite and >= 1 (times slower)");
  }
  if (!(s.slowdown_s >= 0 && std::isfinite(s.slowdown_s))) {
    return bad("sim.slowdown_s", "must be finite and >= 0");
  }
  const auto& d = decentralized;
  FEDFLEET_RETURN_IF_ERROR(oneOf("decentralized.algorithm", d.algorithm,
                                 {"allreduce", "dpsgd", "adpsgd", "prague", "hop", "local"}));
  FEDFLEET_RETURN_IF_ERROR(
      oneOf("decentralized.topology", d.topology, {"ring", "torus", "random"}));
  if (d.peers < 2 || d.peers > 4096) return bad("decentralized.peers", "must be in [2, 4096]");
  if (s.peer_failures >= d.peers) {
    return bad("sim.peer_failures", "must be below decentralized.peers (someone must be left)");
  }
  if (s.peer_failures > 0 && !s.peer_fail_at.empty()) {
    return bad("sim.peer_failures", "and sim.peer_fail_at cannot both be set");
  }
  if (d.iterations == 0 && !(d.time_budget_s > 0)) {
    return bad("decentralized.iterations", "must be at least 1 when time_budget_s is 0");
  }
  if (!(d.time_budget_s >= 0 && std::isfinite(d.time_budget_s))) {
    return bad("decentralized.time_budget_s", "must be finite and >= 0 (0: off)");
  }
  if (!(d.eval_every_s > 0 && std::isfinite(d.eval_every_s))) {
    return bad("decentralized.eval_every_s", "must be finite and > 0");
  }
  if (d.pipeline != 1 && d.pipeline != 2) {
    return bad("decentralized.pipeline", "must be 1 or 2 (Pipe-SGD)");
  }
  if (auto spec = compress::parseCodecSpec(d.codec); !spec.isOk()) {
    return bad("decentralized.codec", spec.status().message());
  } else if (compress::factorsMatrices(*spec)) {
    return bad("decentralized.codec",
               "lowrank factors whole tensors, and the all-reduce sends segments of the flat "
               "model; use none, fp16, bf16, qsgd8, qsgd4, topk or sign");
  }
  // The degree is the random topology's alone (a ring or a torus fixes its own).
  if (d.topology == "random" && (d.degree < 1 || d.degree >= d.peers)) {
    return bad("decentralized.degree", "must be in [1, peers - 1]");
  }
  if (d.topology == "random" && (uint64_t{d.peers} * d.degree) % 2 != 0) {
    return bad("decentralized.degree", "times peers must be even for a random regular graph");
  }
  if (d.algorithm == "prague" && (d.group_size < 2 || d.group_size > d.peers)) {
    return bad("decentralized.group_size", "must be in [2, peers]");
  }
  if (d.group_buffer == 0) return bad("decentralized.group_buffer", "must be at least 1");
  if (d.local_steps == 0) return bad("decentralized.local_steps", "must be at least 1");
  if (d.steps_per_iteration == 0) {
    return bad("decentralized.steps_per_iteration", "must be at least 1");
  }
  if (!(d.outer_lr > 0 && std::isfinite(d.outer_lr))) {
    return bad("decentralized.outer_lr", "must be finite and > 0");
  }
  if (!(d.outer_momentum >= 0 && d.outer_momentum < 1)) {
    return bad("decentralized.outer_momentum", "must be in [0, 1)");
  }
  if (!(d.mbps >= 0 && std::isfinite(d.mbps))) {
    return bad("decentralized.mbps", "must be finite and >= 0 (0: the fleet's links)");
  }
  if (!(d.latency_ms >= 0 || d.latency_ms == -1) || !std::isfinite(d.latency_ms)) {
    return bad("decentralized.latency_ms", "must be >= 0, or -1 for the fleet's links");
  }
  // A decentralised run keeps no checkpoint (the models live on the peers): a resume would
  // silently start over, so it is refused.
  if (policy.mode == PolicyMode::kDecentralized && coordinator.resume) {
    return bad("coordinator.resume",
               "a decentralised run cannot be resumed (the peers hold the models and no "
               "checkpoint is kept); start it again without --resume");
  }
  return Status::ok();
}

Status Config::validateSecAgg() const {
  // The mode is checked when the config is read; as for [dp], ranges and combinations are
  // engine::validateSecAggOptions's.
  return Status::ok();
}

Status Config::validateDp() const {
  // The ranges and the combinations that cannot work are the engine's check
  // (engine::validateDpOptions), which every driver runs before the first round; the mode is
  // checked when the config is read.
  return Status::ok();
}

Status Config::validateBlocks() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return invalidArgument("'" + key + "' " + why);
  };
  const auto& b = blocks;
  if (!(b.skew >= 0 && b.skew <= 1)) return bad("blocks.skew", "must be in [0, 1]");
  if (!(b.overlap >= 0 && b.overlap <= 1)) return bad("blocks.overlap", "must be in [0, 1]");
  if (b.block_s < 0) return bad("blocks.block_s", "must be >= 0");
  if (b.count == 0) return Status::ok();
  if ((b.rounds_per_block > 0) == (b.block_s > 0)) {
    return bad("blocks.rounds_per_block",
               "or blocks.block_s (exactly one of them) must be set when blocks.count > 0");
  }
  if (readsDataFiles()) {
    return bad("blocks.count", "must be 0 with data.format = \"" + dataFormatName() +
                                   "\": block-cyclic runs use fashion-mnist or synthetic data");
  }
  if (dataFormat() != data::DataFormat::kSynthetic && b.count > 10) {
    return bad("blocks.count", "must be at most 10 with fashion-mnist (one class group a block)");
  }
  if (b.test_samples == 0) return bad("blocks.test_samples", "must be at least 1");
  if (policy.mode != PolicyMode::kSync) return bad("policy.mode", "must be \"sync\" with blocks");
  if (coordinator.sample_from != SampleFrom::kClients) {
    return bad("coordinator.sample_from",
               "must be \"clients\" with blocks (a client's block "
               "follows its partition)");
  }
  if (b.mode == BlocksMode::kMultichain &&
      (aggregation.method == AggregationMethod::kScaffold ||
       aggregation.server_optimizer != ServerOptimizer::kFedAvg)) {
    return bad("blocks.mode",
               "multichain needs an aggregation without state across rounds (the shared and the "
               "block chains alternate): aggregation.method other than scaffold and "
               "aggregation.server_optimizer = \"fedavg\"");
  }
  return Status::ok();
}

Status Config::validatePolicy() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return invalidArgument("'" + key + "' " + why);
  };
  const auto& p = policy;
  if (!(p.deadline_percentile > 0 && p.deadline_percentile <= 1)) {
    return bad("policy.deadline_percentile", "must be in (0, 1]");
  }
  if (p.deadline_window == 0) return bad("policy.deadline_window", "must be at least 1");
  if (!(p.deadline_slack > 0)) return bad("policy.deadline_slack", "must be > 0");
  if (p.over_selection < 0 || p.over_selection > 10) {
    return bad("policy.over_selection", "must be in [0, 10]");
  }
  if (!(p.adaptive_target > 0 && p.adaptive_target <= 1)) {
    return bad("policy.adaptive_target", "must be in (0, 1]");
  }
  if (!(p.adaptive_max_factor >= 1)) return bad("policy.adaptive_max_factor", "must be >= 1");
  if (p.async_concurrency == 0) return bad("policy.async_concurrency", "must be at least 1");
  if (p.async_buffer == 0) return bad("policy.async_buffer", "must be at least 1");
  if (p.mode == PolicyMode::kAsync && p.over_selection > 0) {
    return bad("policy.over_selection", "applies to mode = \"sync\" only");
  }
  return Status::ok();
}

Status Config::validateAggregation() const {
  auto bad = [](const std::string& key, const std::string& why) {
    return invalidArgument("'" + key + "' " + why);
  };
  const auto& a = aggregation;
  if (!(a.trim_fraction >= 0 && a.trim_fraction < 0.5)) {
    return bad("aggregation.trim_fraction", "must be in [0, 0.5)");
  }
  if (a.clip_norm < 0) return bad("aggregation.clip_norm", "must be >= 0 (0: off)");
  if (!(a.server_momentum >= 0 && a.server_momentum < 1)) {
    return bad("aggregation.server_momentum", "must be in [0, 1)");
  }
  if (!(a.beta1 >= 0 && a.beta1 < 1)) return bad("aggregation.beta1", "must be in [0, 1)");
  if (!(a.beta2 >= 0 && a.beta2 < 1)) return bad("aggregation.beta2", "must be in [0, 1)");
  if (!(a.tau > 0)) return bad("aggregation.tau", "must be > 0");
  if (a.buffer_mib == 0) return bad("aggregation.buffer_mib", "must be at least 1");
  if (!(a.norm_bound == 0 || (a.norm_bound >= 1 && std::isfinite(a.norm_bound)))) {
    return bad("aggregation.norm_bound",
               "must be 0 (off) or a finite multiple >= 1 of the median norm");
  }
  if (a.norm_window == 0) return bad("aggregation.norm_window", "must be at least 1 round");
  if (!(a.norm_growth >= 1 && std::isfinite(a.norm_growth))) {
    return bad("aggregation.norm_growth", "must be a finite factor >= 1");
  }
  if (!(a.weight_cap == 0 || (a.weight_cap >= 1 && std::isfinite(a.weight_cap)))) {
    return bad("aggregation.weight_cap",
               "must be 0 (off) or a finite multiple >= 1 of the median weight");
  }
  if (a.method == AggregationMethod::kScaffold) {
    for (const auto& [key, spec_text] :
         {std::pair<const char*, const std::string&>{"coordinator.codec", coordinator.codec},
          {"coordinator.slow_link_codec", coordinator.slow_link_codec}}) {
      auto spec = compress::parseCodecSpec(spec_text.empty() ? "none" : spec_text);
      if (spec.isOk() && compress::usesErrorFeedback(*spec)) {
        return bad(key,
                   "uses error feedback, which SCAFFOLD's updates (delta and control "
                   "delta) do not support; use none, fp16, bf16, qsgd8 or qsgd4");
      }
    }
  }
  if (a.method == AggregationMethod::kScaffold && a.clip_norm > 0) {
    return bad("aggregation.clip_norm",
               "is not supported with SCAFFOLD (it would scale the "
               "control variates too); set it to 0");
  }
  if (policy.mode == PolicyMode::kAsync && a.method != AggregationMethod::kFedAvg) {
    return bad("aggregation.method",
               "must be fedavg with policy.mode = \"async\" (FedBuff weighs by staleness), got \"" +
                   choiceName(a.method) + "\"");
  }
  return Status::ok();
}

nlohmann::json Config::toJson() const {
  nlohmann::json j = nlohmann::json::object();
  // forEachField lists each section's keys together: look each section up once.
  std::string_view section_name;
  nlohmann::json* section = nullptr;
  forEachField(*this, [&](std::string_view key, const auto& member) {
    const size_t dot = key.find('.');
    if (section == nullptr || key.substr(0, dot) != section_name) {
      section_name = key.substr(0, dot);
      section = &j[std::string(section_name)];
    }
    using T = std::decay_t<decltype(member)>;
    if constexpr (kIsChoice<T>) {
      (*section)[std::string(key.substr(dot + 1))] = std::string(member.name());
    } else {
      (*section)[std::string(key.substr(dot + 1))] = member;
    }
  });
  return j;
}

namespace {

// One value of the config as a TOML node (lists element by element).
template <typename T>
void insertToml(toml::table& section, std::string_view key, const T& member) {
  if constexpr (kIsChoice<T>) {
    section.insert(key, std::string(member.name()));
  } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                       std::is_floating_point_v<T>) {
    section.insert(key, member);
  } else if constexpr (std::is_integral_v<T>) {
    section.insert(key, static_cast<int64_t>(member));
  } else {
    toml::array list;
    for (const auto& v : member) {
      using E = std::decay_t<decltype(v)>;
      if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>) {
        list.push_back(static_cast<int64_t>(v));
      } else {
        list.push_back(v);
      }
    }
    section.insert(key, std::move(list));
  }
}

}  // namespace

std::string Config::toToml() const {
  toml::table root;
  forEachField(*this, [&](std::string_view key, const auto& member) {
    const size_t dot = key.find('.');
    const std::string section_name(key.substr(0, dot));
    if (!root.contains(section_name)) root.insert(section_name, toml::table{});
    insertToml(*root[section_name].as_table(), key.substr(dot + 1),
               static_cast<const std::decay_t<decltype(member)>&>(member));
  });
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

std::vector<std::string> Config::keys() {
  std::vector<std::string> out;
  Config c;
  forEachField(c, [&](std::string_view key, auto&) { out.emplace_back(key); });
  return out;
}

}  // namespace fedfleet::config
