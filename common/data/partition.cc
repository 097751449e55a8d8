#include "common/data/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace fedfleet::data {
namespace {

using Partitions = std::vector<std::vector<uint32_t>>;

constexpr int kDirichletMaxDraws = 1000;

void sortAll(Partitions& parts) {
  for (auto& p : parts) std::sort(p.begin(), p.end());
}

// Indices of each class, in ascending order.
std::vector<std::vector<uint32_t>> indicesByClass(const std::vector<Label>& labels,
                                                  uint32_t num_classes) {
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (size_t i = 0; i < labels.size(); ++i)
    by_class[labels[i]].push_back(static_cast<uint32_t>(i));
  return by_class;
}

Partitions partitionIid(size_t n, uint32_t parts, std::mt19937_64& rng) {
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  Partitions out(parts);
  const size_t base = n / parts, extra = n % parts;
  size_t pos = 0;
  for (uint32_t p = 0; p < parts; ++p) {
    const size_t len = base + (p < extra ? 1 : 0);
    out[p].assign(order.begin() + pos, order.begin() + pos + len);
    pos += len;
  }
  sortAll(out);
  return out;
}

// One draw from Dir(alpha, ..., alpha) of dimension `dim`. Works in log space: for alpha < 1 a
// Gamma(alpha) variate is Gamma(alpha + 1) * U^(1/alpha), whose logarithm does not underflow
// even for alpha = 0.01, where plain gamma draws are often exactly zero.
std::vector<double> sampleDirichlet(double alpha, size_t dim, std::mt19937_64& rng) {
  std::vector<double> logs(dim);
  const bool boost = alpha < 1.0;
  std::gamma_distribution<double> gamma(boost ? alpha + 1.0 : alpha, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (auto& l : logs) {
    const double g = std::max(gamma(rng), std::numeric_limits<double>::min());
    l = std::log(g);
    if (boost) l += std::log(1.0 - uniform(rng)) / alpha;  // 1 - U lies in (0, 1]
  }
  const double top = *std::max_element(logs.begin(), logs.end());
  double sum = 0;
  for (auto& l : logs) sum += (l = std::exp(l - top));
  for (auto& l : logs) l /= sum;
  return logs;
}

Result<Partitions> partitionDirichlet(const std::vector<Label>& labels, uint32_t num_classes,
                                      const PartitionSpec& spec, std::mt19937_64& rng) {
  const size_t n = labels.size();
  const uint32_t parts = spec.num_partitions;
  if (static_cast<uint64_t>(parts) * spec.min_samples > n) {
    return invalidArgument("dirichlet partition: " + std::to_string(parts) +
                           " partitions of at least " + std::to_string(spec.min_samples) +
                           " samples need more than the " + std::to_string(n) +
                           " samples available");
  }
  const auto by_class = indicesByClass(labels, num_classes);
  const double fair_share = static_cast<double>(n) / parts;
  std::vector<uint32_t> idx_k;
  for (int draw = 0; draw < kDirichletMaxDraws; ++draw) {
    Partitions out(parts);
    for (uint32_t k = 0; k < num_classes; ++k) {
      idx_k = by_class[k];
      std::shuffle(idx_k.begin(), idx_k.end(), rng);
      std::vector<double> p = sampleDirichlet(spec.alpha, parts, rng);
      if (spec.balance) {  // NIID-Bench: partitions above the fair share get nothing more
        std::vector<double> q(parts);
        double qsum = 0;
        for (uint32_t j = 0; j < parts; ++j) {
          qsum += (q[j] = out[j].size() < fair_share ? p[j] : 0.0);
        }
        if (qsum > 0) {
          for (uint32_t j = 0; j < parts; ++j) p[j] = q[j] / qsum;
        }
      }
      double cum = 0;
      size_t begin = 0;
      for (uint32_t j = 0; j < parts; ++j) {
        size_t end = idx_k.size();
        if (j + 1 < parts) {
          cum += p[j];
          end = std::clamp(static_cast<size_t>(cum * static_cast<double>(idx_k.size())), begin,
                           idx_k.size());
        }
        out[j].insert(out[j].end(), idx_k.begin() + begin, idx_k.begin() + end);
        begin = end;
      }
    }
    size_t smallest = n;
    for (const auto& part : out) smallest = std::min(smallest, part.size());
    if (smallest >= spec.min_samples) {
      sortAll(out);
      return out;
    }
  }
  return invalidArgument("dirichlet partition: no draw in " + std::to_string(kDirichletMaxDraws) +
                         " gave every one of " + std::to_string(parts) + " partitions at least " +
                         std::to_string(spec.min_samples) + " samples (alpha " +
                         std::to_string(spec.alpha) + "); raise alpha or lower min_samples");
}

Partitions partitionLabels(const std::vector<Label>& labels, uint32_t num_classes,
                           const PartitionSpec& spec, std::mt19937_64& rng) {
  const uint32_t parts = spec.num_partitions, c = spec.labels_per_client, k_all = num_classes;
  std::vector<bool> covered(k_all, false);
  for (uint32_t i = 0; i < std::min(parts, k_all); ++i) covered[i] = true;
  std::vector<uint32_t> uncovered;
  for (uint32_t k = 0; k < k_all; ++k) {
    if (!covered[k]) uncovered.push_back(k);
  }
  std::uniform_int_distribution<uint32_t> any_label(0, k_all - 1);
  std::vector<std::vector<uint32_t>> holds(parts);
  std::vector<std::vector<uint32_t>> holders(k_all);  // partitions holding each class, ascending
  for (uint32_t i = 0; i < parts; ++i) {
    auto& held = holds[i];
    held.push_back(i % k_all);
    while (held.size() < c) {
      uint32_t pick;
      if (!uncovered.empty()) {
        std::uniform_int_distribution<size_t> which(0, uncovered.size() - 1);
        const size_t w = which(rng);
        pick = uncovered[w];
        uncovered[w] = uncovered.back();
        uncovered.pop_back();
      } else {
        pick = any_label(rng);
        if (std::find(held.begin(), held.end(), pick) != held.end()) continue;
      }
      held.push_back(pick);
    }
    for (uint32_t k : held) holders[k].push_back(i);
  }
  auto by_class = indicesByClass(labels, num_classes);
  Partitions out(parts);
  for (uint32_t k = 0; k < k_all; ++k) {
    auto& idx_k = by_class[k];
    std::shuffle(idx_k.begin(), idx_k.end(), rng);
    const size_t t = holders[k].size();
    if (t == 0) continue;
    const size_t base = idx_k.size() / t, extra = idx_k.size() % t;
    size_t pos = 0;
    for (size_t h = 0; h < t; ++h) {
      const size_t len = base + (h < extra ? 1 : 0);
      auto& dst = out[holders[k][h]];
      dst.insert(dst.end(), idx_k.begin() + pos, idx_k.begin() + pos + len);
      pos += len;
    }
  }
  sortAll(out);
  return out;
}

Partitions partitionShards(const std::vector<Label>& labels, const PartitionSpec& spec,
                           std::mt19937_64& rng) {
  const size_t n = labels.size();
  std::vector<uint32_t> by_label(n);
  for (size_t i = 0; i < n; ++i) by_label[i] = static_cast<uint32_t>(i);
  std::stable_sort(by_label.begin(), by_label.end(),
                   [&](uint32_t a, uint32_t b) { return labels[a] < labels[b]; });
  const uint64_t shards = uint64_t{spec.num_partitions} * spec.shards_per_client;
  const size_t shard_size = n / shards;
  std::vector<uint64_t> deal(shards);
  for (uint64_t s = 0; s < shards; ++s) deal[s] = s;
  std::shuffle(deal.begin(), deal.end(), rng);
  Partitions out(spec.num_partitions);
  for (uint32_t p = 0; p < spec.num_partitions; ++p) {
    out[p].reserve(shard_size * spec.shards_per_client);
    for (uint32_t j = 0; j < spec.shards_per_client; ++j) {
      const auto first =
          by_label.begin() + deal[uint64_t{p} * spec.shards_per_client + j] * shard_size;
      out[p].insert(out[p].end(), first, first + shard_size);
    }
  }
  sortAll(out);
  return out;
}

Result<Partitions> partitionQuantity(size_t n, const PartitionSpec& spec, std::mt19937_64& rng) {
  const uint32_t parts = spec.num_partitions;
  if (static_cast<uint64_t>(parts) * spec.min_samples > n) {
    return invalidArgument("quantity partition: " + std::to_string(parts) +
                           " partitions of at least " + std::to_string(spec.min_samples) +
                           " samples need more than the " + std::to_string(n) +
                           " samples available");
  }
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<size_t> cuts(parts + 1);
  for (int draw = 0; draw < kDirichletMaxDraws; ++draw) {
    const std::vector<double> q = sampleDirichlet(spec.alpha, parts, rng);
    double cum = 0;
    size_t smallest = n;
    cuts[0] = 0;
    for (uint32_t j = 0; j < parts; ++j) {
      size_t end = n;
      if (j + 1 < parts) {
        cum += q[j];
        end = std::clamp(static_cast<size_t>(cum * static_cast<double>(n)), cuts[j], n);
      }
      cuts[j + 1] = end;
      smallest = std::min(smallest, end - cuts[j]);
    }
    if (smallest >= spec.min_samples) {
      Partitions out(parts);
      for (uint32_t j = 0; j < parts; ++j) {
        out[j].assign(order.begin() + cuts[j], order.begin() + cuts[j + 1]);
      }
      sortAll(out);
      return out;
    }
  }
  return invalidArgument("quantity partition: no draw in " + std::to_string(kDirichletMaxDraws) +
                         " gave every one of " + std::to_string(parts) + " partitions at least " +
                         std::to_string(spec.min_samples) + " samples (alpha " +
                         std::to_string(spec.alpha) + "); raise alpha or lower min_samples");
}

}  // namespace

std::vector<std::string> partitionSchemeNames() {
  return {"iid", "dirichlet", "labels", "shards", "quantity"};
}

namespace {

// The checks every scheme shares: n addressable, 1 <= num_partitions <= n; alpha for the
// schemes that draw from a Dirichlet.
Status checkSpec(size_t n, const PartitionSpec& spec) {
  if (n > std::numeric_limits<uint32_t>::max()) {
    return invalidArgument("partition: more samples than 32-bit indices can address");
  }
  if (spec.num_partitions == 0) return invalidArgument("partition: num_partitions must be > 0");
  if (spec.num_partitions > n) {
    return invalidArgument("partition: num_partitions " + std::to_string(spec.num_partitions) +
                           " exceeds the " + std::to_string(n) + " samples");
  }
  if ((spec.scheme == "dirichlet" || spec.scheme == "quantity") &&
      (!(spec.alpha > 0) || !std::isfinite(spec.alpha))) {
    return invalidArgument("partition: " + spec.scheme + " alpha must be a finite value > 0, got " +
                           std::to_string(spec.alpha));
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<std::vector<uint32_t>>> partitionUnlabelled(size_t n,
                                                               const PartitionSpec& spec) {
  try {
    FEDFLEET_RETURN_IF_ERROR(checkSpec(n, spec));
    std::mt19937_64 rng(spec.seed);
    if (spec.scheme == "iid") return partitionIid(n, spec.num_partitions, rng);
    if (spec.scheme == "quantity") return partitionQuantity(n, spec, rng);
    return invalidArgument("partition: '" + spec.scheme +
                           "' splits by class label, and these samples have none (regression "
                           "targets): use iid or quantity");
  } catch (const std::bad_alloc&) {
    return resourceExhausted("partition: out of memory");
  }
}

Result<std::vector<std::vector<uint32_t>>> partitionIndices(const std::vector<Label>& labels,
                                                            uint32_t num_classes,
                                                            const PartitionSpec& spec) {
  try {
    const size_t n = labels.size();
    FEDFLEET_RETURN_IF_ERROR(checkSpec(n, spec));
    if (num_classes == 0) return invalidArgument("partition: num_classes must be > 0");
    for (size_t i = 0; i < n; ++i) {
      if (labels[i] >= num_classes) {
        return invalidArgument("partition: label " + std::to_string(labels[i]) + " of sample " +
                               std::to_string(i) + " is not below num_classes " +
                               std::to_string(num_classes));
      }
    }
    std::mt19937_64 rng(spec.seed);
    if (spec.scheme == "iid") return partitionIid(n, spec.num_partitions, rng);
    if (spec.scheme == "quantity") return partitionQuantity(n, spec, rng);
    if (spec.scheme == "dirichlet") return partitionDirichlet(labels, num_classes, spec, rng);
    if (spec.scheme == "labels") {
      if (spec.labels_per_client == 0 || spec.labels_per_client > num_classes) {
        return invalidArgument("partition: labels_per_client must be in 1.." +
                               std::to_string(num_classes) + ", got " +
                               std::to_string(spec.labels_per_client));
      }
      return partitionLabels(labels, num_classes, spec, rng);
    }
    if (spec.scheme == "shards") {
      if (spec.shards_per_client == 0 ||
          uint64_t{spec.num_partitions} * spec.shards_per_client > n) {
        return invalidArgument(
            "partition: shards_per_client must be >= 1 with num_partitions * "
            "shards_per_client (" +
            std::to_string(uint64_t{spec.num_partitions} * spec.shards_per_client) + ") <= the " +
            std::to_string(n) + " samples");
      }
      return partitionShards(labels, spec, rng);
    }
    std::string valid;
    for (const auto& name : partitionSchemeNames()) valid += (valid.empty() ? "" : ", ") + name;
    return invalidArgument("partition: unknown scheme '" + spec.scheme + "' (valid: " + valid +
                           ")");
  } catch (const std::bad_alloc&) {
    return resourceExhausted("partition: out of memory");
  } catch (const std::exception& e) {
    return internalError(std::string("partition: ") + e.what());
  }
}

}  // namespace fedfleet::data
