#include "common/compress/codec_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>
#include <vector>

#include "common/compress/lowrank.h"

namespace fedfleet::compress {
namespace {

constexpr const char* kNames =
    "none, fp32, fp16, bf16, qsgd8, qsgd4, topk[:ratio], sign, lowrank[:rank]";

Status bad(const std::string& text, const std::string& why) {
  return invalidArgument("codec \"" + text + "\": " + why);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

bool parseDouble(std::string_view s, double* out) {
  const auto res = std::from_chars(s.data(), s.data() + s.size(), *out);
  return res.ec == std::errc() && res.ptr == s.data() + s.size();
}

bool parseUint32(std::string_view s, uint32_t* out) {
  const auto res = std::from_chars(s.data(), s.data() + s.size(), *out);
  return res.ec == std::errc() && res.ptr == s.data() + s.size();
}

bool hasBucket(const std::string& name) { return name == "qsgd" || name == "sign"; }

std::string shortest(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

}  // namespace

bool isBiased(const CodecSpec& spec) {
  return spec.name == "topk" || spec.name == "sign" || spec.name == "lowrank";
}

bool usesErrorFeedback(const CodecSpec& spec) { return isBiased(spec) && spec.error_feedback; }

CodecSpec codecForRound(const CodecSpec& spec, uint64_t round) {
  if (spec.name != "topk" || spec.warmup == 0) return spec;
  CodecSpec out = spec;
  out.warmup = 0;
  if (round >= 1 && round <= spec.warmup) {
    out.ratio = std::min(1.0, std::ldexp(spec.ratio, static_cast<int>(spec.warmup - round + 1)));
  }
  return out;
}

std::string residualKey(const CodecSpec& spec) {
  CodecSpec s = spec;
  s.ratio = CodecSpec().ratio;
  s.warmup = CodecSpec().warmup;
  s.dense_below = CodecSpec().dense_below;
  s.rank = CodecSpec().rank;
  return toString(s);
}

bool selectsPerTensor(const CodecSpec& spec) {
  return spec.name == "topk" || factorsMatrices(spec);
}

bool factorsMatrices(const CodecSpec& spec) { return spec.name == "lowrank"; }

bool encodesOnDevice(const CodecSpec& spec) { return spec.name != "lowrank"; }

bool denseBelow(const CodecSpec& spec, uint64_t numel) {
  return spec.name == "topk" && numel < spec.dense_below;
}

CodecKind payloadKind(const CodecSpec& spec) {
  const std::string& n = spec.name;
  if (n == "fp16") return CodecKind::kFp16;
  if (n == "bf16") return CodecKind::kBf16;
  if (n == "qsgd") return CodecKind::kQsgd;
  if (n == "topk") return CodecKind::kTopk;
  if (n == "sign") return CodecKind::kSign;
  if (n == "lowrank") return CodecKind::kLowrank;
  return CodecKind::kNone;
}

bool acceptsPayload(const CodecSpec& spec, CodecKind kind) {
  if (kind == payloadKind(spec)) return true;
  return kind == CodecKind::kFp16 && spec.name == "topk" && spec.dense_below > 0;
}

Status validate(const CodecSpec& spec) {
  const std::string& n = spec.name;
  if (n != "none" && n != "fp16" && n != "bf16" && n != "qsgd" && n != "topk" && n != "sign" &&
      n != "lowrank") {
    return invalidArgument("unknown codec name \"" + n +
                           "\" (expected none, fp16, bf16, qsgd, topk, sign or lowrank)");
  }
  if (n == "lowrank" && (spec.rank < 1 || spec.rank > kMaxRank)) {
    return invalidArgument("lowrank rank must be in [1, " + std::to_string(kMaxRank) + "], not " +
                           std::to_string(spec.rank));
  }
  if (n == "qsgd" && spec.bits != 8 && spec.bits != 4) {
    return invalidArgument("qsgd bits must be 8 or 4, not " + std::to_string(spec.bits));
  }
  if (hasBucket(n) && (spec.bucket < 8 || spec.bucket > kMaxBucket || spec.bucket % 8 != 0)) {
    return invalidArgument("bucket must be a multiple of 8 in [8, " + std::to_string(kMaxBucket) +
                           "], not " + std::to_string(spec.bucket));
  }
  if (n == "topk" && !(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
    return invalidArgument("topk ratio must be in (0, 1], not " + shortest(spec.ratio));
  }
  if (n == "topk" && spec.warmup > kMaxWarmup) {
    return invalidArgument("topk warmup must be in [0, " + std::to_string(kMaxWarmup) + "], not " +
                           std::to_string(spec.warmup));
  }
  if (n == "topk" && spec.dense_below > kMaxDenseBelow) {
    return invalidArgument("topk dense_below must be in [0, " + std::to_string(kMaxDenseBelow) +
                           "], not " + std::to_string(spec.dense_below));
  }
  if (n != "lowrank" && spec.rank != CodecSpec().rank) {
    return invalidArgument("rank applies to lowrank only");
  }
  if (n != "topk" && spec.dense_below != 0) {
    return invalidArgument("dense_below applies to topk only");
  }
  return Status::ok();
}

Result<CodecSpec> parseCodecSpec(const std::string& text) {
  const std::vector<std::string_view> parts = split(text, ',');
  const std::vector<std::string_view> head = split(parts[0], ':');
  if (head.size() > 2) return bad(text, "more than one ':'");
  const std::string_view name = head[0];
  CodecSpec spec;
  if (name == "none" || name == "fp32") {
    spec.name = "none";
  } else if (name == "fp16" || name == "bf16" || name == "topk" || name == "sign" ||
             name == "lowrank") {
    spec.name = std::string(name);
  } else if (name == "qsgd8" || name == "qsgd4") {
    spec.name = "qsgd";
    spec.bits = name == "qsgd8" ? 8 : 4;
  } else {
    return bad(text, "unknown codec \"" + std::string(name) + "\" (expected " + kNames + ")");
  }
  if (head.size() == 2 && spec.name == "lowrank") {
    if (!parseUint32(head[1], &spec.rank) || spec.rank < 1 || spec.rank > kMaxRank) {
      return bad(text, "lowrank rank \"" + std::string(head[1]) +
                           "\" is not a whole number in [1, " + std::to_string(kMaxRank) + "]");
    }
  } else if (head.size() == 2) {
    if (spec.name != "topk") {
      return bad(text, "only topk and lowrank take a ':' argument (the ratio, the rank)");
    }
    if (!parseDouble(head[1], &spec.ratio) || !(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
      return bad(text, "topk ratio \"" + std::string(head[1]) + "\" is not a number in (0, 1]");
    }
  }
  bool seen_bucket = false, seen_ef = false, seen_warmup = false, seen_dense = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string_view::npos) {
      return bad(text, "option \"" + std::string(parts[i]) + "\" is not key=value");
    }
    const std::string_view key = parts[i].substr(0, eq);
    const std::string_view value = parts[i].substr(eq + 1);
    if (key == "bucket") {
      if (!hasBucket(spec.name)) return bad(text, "bucket applies to qsgd8, qsgd4 and sign only");
      if (seen_bucket) return bad(text, "bucket given twice");
      seen_bucket = true;
      if (!parseUint32(value, &spec.bucket) || spec.bucket < 8 || spec.bucket > kMaxBucket ||
          spec.bucket % 8 != 0) {
        return bad(text, "bucket \"" + std::string(value) + "\" is not a multiple of 8 in [8, " +
                             std::to_string(kMaxBucket) + "]");
      }
    } else if (key == "ef") {
      if (!isBiased(spec)) {
        return bad(text,
                   "ef (error feedback) applies to the biased codecs topk, sign and lowrank only");
      }
      if (seen_ef) return bad(text, "ef given twice");
      seen_ef = true;
      if (value == "on") {
        spec.error_feedback = true;
      } else if (value == "off") {
        spec.error_feedback = false;
      } else {
        return bad(text, "ef must be on or off, not \"" + std::string(value) + "\"");
      }
    } else if (key == "warmup") {
      if (spec.name != "topk") return bad(text, "warmup applies to topk only");
      if (seen_warmup) return bad(text, "warmup given twice");
      seen_warmup = true;
      if (!parseUint32(value, &spec.warmup) || spec.warmup > kMaxWarmup) {
        return bad(text, "warmup \"" + std::string(value) + "\" is not a whole number in [0, " +
                             std::to_string(kMaxWarmup) + "]");
      }
    } else if (key == "dense_below") {
      if (spec.name != "topk") return bad(text, "dense_below applies to topk only");
      if (seen_dense) return bad(text, "dense_below given twice");
      seen_dense = true;
      if (!parseUint32(value, &spec.dense_below) || spec.dense_below > kMaxDenseBelow) {
        return bad(text, "dense_below \"" + std::string(value) +
                             "\" is not a whole number in [0, " + std::to_string(kMaxDenseBelow) +
                             "]");
      }
    } else {
      return bad(text, "unknown option \"" + std::string(key) +
                           "\" (expected bucket, ef, warmup or dense_below)");
    }
  }
  return spec;
}

std::string toString(const CodecSpec& spec) {
  std::string s = spec.name;
  if (spec.name == "qsgd") {
    s += std::to_string(spec.bits);
  } else if (spec.name == "topk") {
    s += ':';
    s += shortest(spec.ratio);
  } else if (spec.name == "lowrank") {
    s += ':' + std::to_string(spec.rank);
  }
  if (hasBucket(spec.name) && spec.bucket != CodecSpec().bucket) {
    s += ",bucket=" + std::to_string(spec.bucket);
  }
  if (isBiased(spec) && !spec.error_feedback) s += ",ef=off";
  if (spec.name == "topk" && spec.warmup != CodecSpec().warmup) {
    s += ",warmup=" + std::to_string(spec.warmup);
  }
  if (spec.dense_below != CodecSpec().dense_below) {
    s += ",dense_below=" + std::to_string(spec.dense_below);
  }
  return s;
}

}  // namespace fedfleet::compress
