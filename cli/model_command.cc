#include "cli/model_command.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/history_open.h"
#include "common/atomic_file.h"
#include "common/crypto/sha256.h"
#include "common/history/history.h"
#include "common/model/export.h"
#include "common/model/local_part.h"
#include "common/model/model.h"

namespace fedfleet::cli {
namespace {

constexpr const char* kCommand = "model";

int fail(const Status& s, int code) {
  std::cerr << "fedfleet model: " << s.toString() << "\n";
  return code;
}

// The run's model description: the recorded one, or for a run recorded before runs.model_json
// existed (when every run trained Fashion-MNIST), rebuilt from its configuration.
Result<model::ModelDescription> describedModel(const history::RunRecord& run) {
  if (!run.model_json.empty()) {
    auto d = model::parseModelDescription(run.model_json);
    if (!d.isOk()) {
      return corrupt("run " + std::to_string(run.run_id) + ": " + d.status().message());
    }
    return d;
  }
  const nlohmann::json config = nlohmann::json::parse(run.config_json, nullptr, false);
  const nlohmann::json m = config.is_object() ? config.value("model", nlohmann::json()) : nullptr;
  if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) {
    return corrupt("run " + std::to_string(run.run_id) +
                   " records neither its model's layout nor a model name in its configuration");
  }
  model::ModelDescription d;
  d.name = m["name"].get<std::string>();
  d.path = m.value("path", std::string());
  FEDFLEET_ASSIGN_OR_RETURN(auto built, model::createModel(d.name, 0, d.path, d.shape));
  d.layout = built->layout();
  return d;
}

// How good the model each round ended with is, where that is known: its test accuracy, else
// the federated accuracy of the next round (whose tasks carried that model); a run without
// accuracies (a regression) by its loss the same way, as minus the loss (higher is better).
struct Scores {
  std::map<uint32_t, double> value;
  std::set<uint32_t> federated;  // rounds whose score is the clients' federated figure
  bool by_loss = false;
};

Result<Scores> scoresOf(history::HistoryStore& store, int64_t run) {
  FEDFLEET_ASSIGN_OR_RETURN(auto rounds, store.rounds(run));
  Scores out;
  auto fill = [&](auto federated, auto test) {
    for (const auto& r : rounds) {
      if (r.round > 0 && federated(r)) {
        out.value[r.round - 1] = *federated(r);
        out.federated.insert(r.round - 1);
      }
    }
    for (const auto& r : rounds) {
      if (test(r)) {
        out.value[r.round] = *test(r);
        out.federated.erase(r.round);
      }
    }
  };
  fill([](const history::RoundRecord& r) { return r.fed_eval_accuracy; },
       [](const history::RoundRecord& r) { return r.test_accuracy; });
  if (!out.value.empty()) return out;
  out.by_loss = true;
  auto negated = [](const std::optional<double>& v) {
    return v ? std::optional<double>(-*v) : std::nullopt;
  };
  fill([&](const history::RoundRecord& r) { return negated(r.fed_eval_loss); },
       [&](const history::RoundRecord& r) { return negated(r.test_loss); });
  return out;
}

// The checkpointed round of the best score (test, else federated), the earliest of equals
// (the one HistoryStore::pruneCheckpoints keeps with keep_best).
std::optional<uint32_t> bestRound(const std::vector<uint32_t>& rounds, const Scores& scores) {
  std::optional<uint32_t> best;
  for (uint32_t r : rounds) {
    auto a = scores.value.find(r);
    if (a == scores.value.end()) continue;
    if (!best || a->second > scores.value.at(*best)) best = r;
  }
  return best;
}

std::string roundList(const std::vector<uint32_t>& rounds) {
  std::string out;
  for (uint32_t r : rounds) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out.empty() ? "none" : out;
}

// "test accuracy 87.50%", "federated accuracy 85.10%", "test loss 0.1234", or "-" for round
// `r`: a federated figure (the clients' evaluation of the model the next round carried) is
// never called a test figure.
std::string scoreText(const Scores& scores, uint32_t r) {
  auto a = scores.value.find(r);
  if (a == scores.value.end()) return "-";
  char buf[64];
  const char* source = scores.federated.count(r) ? "federated" : "test";
  if (scores.by_loss) {
    std::snprintf(buf, sizeof(buf), "%s loss %.4f", source, -a->second);
  } else {
    std::snprintf(buf, sizeof(buf), "%s accuracy %.2f%%", source, 100 * a->second);
  }
  return buf;
}

int printInfo(const history::RunRecord& run, const model::ModelDescription& d,
              const std::vector<uint32_t>& rounds, const Scores& scores, bool json) {
  if (json) {
    std::cout << model::descriptionJson(d) << "\n";
    return 0;
  }
  const auto best = bestRound(rounds, scores);
  // A TorchScript model run by a coordinator without data has no recorded input shape or
  // class count: it is said so, not guessed.
  const std::string input = d.shape.sample.empty()
                                ? "input not recorded (no data on the coordinator)"
                                : "input " + model::shapeText(d.shape.sample);
  const std::string classes =
      d.shape.classes > 0 ? ", " + std::to_string(d.shape.classes) + " classes" : "";
  std::cout << "run " << run.run_id << " (" << run.name << "): model " << d.name
            << (d.path.empty() ? "" : " from " + d.path) << ", " << input << classes << ", "
            << d.layout.total << " float32 values in " << d.layout.tensors.size() << " tensors\n";
  std::cout << "checkpoints:";
  if (rounds.empty()) std::cout << " none";
  for (uint32_t r : rounds) {
    std::cout << " " << r << " (" << scoreText(scores, r) << (best && *best == r ? ", best" : "")
              << ")";
  }
  std::cout << "\n";
  // model.local of the run's config: which tensors its clients kept to themselves.
  model::LocalPart local;
  const auto config = nlohmann::json::parse(run.config_json, nullptr, false);
  if (config.is_object() && config.contains("model") && config["model"].contains("local") &&
      config["model"]["local"].is_array()) {
    std::vector<std::string> patterns;
    for (const auto& p : config["model"]["local"]) {
      if (p.is_string()) patterns.push_back(p.get<std::string>());
    }
    if (auto part = model::LocalPart::of(d.layout, patterns); part.isOk()) local = *part;
  }
  std::printf("%-32s %-20s %12s %12s  %s\n", "tensor", "shape", "elements", "offset", "kind");
  for (const auto& t : d.layout.tensors) {
    const std::string kind =
        std::string(t.buffer ? "buffer" : "parameter") + (local.isLocal(t.name) ? ", local" : "");
    std::printf("%-32s %-20s %12zu %12zu  %s\n", t.name.c_str(), model::shapeText(t.shape).c_str(),
                t.numel, t.offset, kind.c_str());
  }
  return 0;
}

// The checkpoint `args` asks for, or the exit status after printing why there is none.
Result<history::CheckpointRecord> chosenCheckpoint(history::HistoryStore& store,
                                                   const ModelArgs& args, int64_t run,
                                                   const std::vector<uint32_t>& rounds,
                                                   const Scores& scores) {
  if (rounds.empty()) {
    return notFound("run " + std::to_string(run) +
                    " has no checkpoint (coordinator.checkpoint_every = 0, or no round "
                    "committed yet)");
  }
  uint32_t round = rounds.back();
  if (args.best) {
    auto best = bestRound(rounds, scores);
    if (!best) {
      return notFound(
          "run " + std::to_string(run) +
          " has no checkpointed round with a test or federated accuracy or loss (kept: rounds " +
          roundList(rounds) + "); use --round R or --last");
    }
    round = *best;
  } else if (args.round) {
    round = *args.round;
  }
  auto cp = store.checkpointAt(run, round);
  if (!cp.isOk() && cp.status().code() == StatusCode::kNotFound) {
    return notFound("run " + std::to_string(run) + " has no checkpoint of round " +
                    std::to_string(round) + " (kept: rounds " + roundList(rounds) +
                    "; coordinator.keep_checkpoints and keep_best decide which stay)");
  }
  return cp;
}

int exportModel(history::HistoryStore& store, const ModelArgs& args, const history::RunRecord& run,
                const model::ModelDescription& d, const std::vector<uint32_t>& rounds,
                const Scores& scores) {
  std::string format = args.format;
  if (format == "auto") format = d.name == "torchscript" ? "torchscript" : "state_dict";
  if (format != "torchscript" && format != "state_dict" && format != "flat") {
    return fail(invalidArgument("unknown --format '" + args.format +
                                "' (valid: auto, torchscript, state_dict, flat)"),
                2);
  }
  if (format == "torchscript" && d.name != "torchscript") {
    return fail(invalidArgument("run " + std::to_string(run.run_id) +
                                " trained the built-in model '" + d.name +
                                "', which exports as a state_dict (--format state_dict) or "
                                "flat, not as TorchScript"),
                2);
  }
  if (format == "state_dict" && d.name == "torchscript") {
    return fail(invalidArgument("run " + std::to_string(run.run_id) +
                                " trained a TorchScript model, which exports as the module "
                                "(--format torchscript) or flat"),
                2);
  }
  if (args.output.empty()) return fail(invalidArgument("export needs -o FILE"), 2);
  if (auto why = unwritableReason(args.output)) {
    return fail(invalidArgument("cannot write " + args.output + ": " + *why), 2);
  }
  auto cp = chosenCheckpoint(store, args, run.run_id, rounds, scores);
  if (!cp.isOk()) return fail(cp.status(), cp.status().code() == StatusCode::kNotFound ? 2 : 1);
  const std::string ctx =
      "run " + std::to_string(run.run_id) + ", checkpoint of round " + std::to_string(cp->round);
  if (cp->blob.size() != d.layout.total * sizeof(float)) {
    return fail(corrupt(ctx + ": holds " + std::to_string(cp->blob.size()) + " bytes, the model " +
                        std::to_string(d.layout.total * sizeof(float)) + " (float32 values)"),
                1);
  }
  if (crypto::toHex(crypto::sha256(cp->blob)) != cp->sha256_hex) {
    return fail(corrupt(ctx + ": the model's bytes do not match their recorded SHA-256 (the "
                              "history file is damaged)"),
                1);
  }
  std::string bytes;
  if (format == "flat") {
    Status st = writeFileAtomically(args.output + ".json", model::descriptionJson(d) + "\n");
    if (!st.isOk()) return fail(st, 1);
    bytes = cp->blob;
  } else {
    auto built = model::rebuildModel(d, args.module);
    if (!built.isOk()) {
      Status s = built.status();
      if (d.name == "torchscript" && args.module.empty()) {
        s = Status(s.code(), s.message() +
                                 " (the run loaded its TorchScript module from there; give "
                                 "--module PATH where that file is now)");
      }
      return fail(s, 1);
    }
    std::vector<float> flat(d.layout.total);
    std::memcpy(flat.data(), cp->blob.data(), cp->blob.size());
    Status st = (*built)->setFlatParameters(flat);
    if (!st.isOk()) return fail(st, 1);
    auto exported = (*built)->exportBytes();
    if (!exported.isOk()) return fail(exported.status(), 1);
    bytes = std::move(*exported);
  }
  Status st = writeFileAtomically(args.output, bytes);
  if (!st.isOk()) return fail(st, 1);
  std::cout << "wrote " << args.output << (format == "flat" ? " and " + args.output + ".json" : "")
            << ": " << format << " of model " << d.name << ", run " << run.run_id << " round "
            << cp->round << " (model version " << cp->model_version << ", "
            << scoreText(scores, cp->round) << "), " << d.layout.total << " parameters\n";
  return 0;
}

}  // namespace

int runModelCommand(const ModelArgs& args) {
  int exit_code = 0;
  auto store = openExisting(args.db, kCommand, &exit_code);
  if (!store) return exit_code;
  auto runs = store->runs();
  if (failed(runs, kCommand)) return 1;
  if (runs->empty()) return fail(notFound(args.db + " holds no run"), 2);
  if (args.run > 0 && !knownRun(*runs, args.run, args.db, kCommand)) return 2;
  const history::RunRecord& run =
      args.run > 0 ? *std::find_if(runs->begin(), runs->end(),
                                   [&args](const auto& r) { return r.run_id == args.run; })
                   : runs->back();
  auto d = describedModel(run);
  if (!d.isOk()) return fail(d.status(), 1);
  auto rounds = store->checkpointRounds(run.run_id);
  if (failed(rounds, kCommand)) return 1;
  auto scores = scoresOf(*store, run.run_id);
  if (failed(scores, kCommand)) return 1;
  if (args.what == "info") return printInfo(run, *d, *rounds, *scores, args.json);
  return exportModel(*store, args, run, *d, *rounds, *scores);
}

}  // namespace fedfleet::cli
