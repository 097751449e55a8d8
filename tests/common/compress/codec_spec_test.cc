// Codec spec text: every documented form parses to the right fields, the canonical text
// round-trips, and every kind of mistake is refused with a message that names it.
#include "common/compress/codec_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fedfleet::compress {
namespace {

using ::testing::HasSubstr;

CodecSpec parsed(const std::string& text) {
  Result<CodecSpec> r = parseCodecSpec(text);
  EXPECT_TRUE(r.isOk()) << text << ": " << r.status().toString();
  return r.isOk() ? r.value() : CodecSpec();
}

TEST(CodecSpec, ParsesEveryDocumentedForm) {
  EXPECT_EQ(parsed("none"), CodecSpec());
  EXPECT_EQ(parsed("fp32").name, "none");
  EXPECT_EQ(parsed("fp16").name, "fp16");
  EXPECT_EQ(parsed("bf16").name, "bf16");
  const CodecSpec q8 = parsed("qsgd8");
  EXPECT_EQ(q8.name, "qsgd");
  EXPECT_EQ(q8.bits, 8u);
  EXPECT_EQ(q8.bucket, 512u);
  const CodecSpec q4 = parsed("qsgd4,bucket=256");
  EXPECT_EQ(q4.bits, 4u);
  EXPECT_EQ(q4.bucket, 256u);
  const CodecSpec topk = parsed("topk:0.001");
  EXPECT_EQ(topk.name, "topk");
  EXPECT_EQ(topk.ratio, 0.001);
  EXPECT_TRUE(topk.error_feedback);
  EXPECT_EQ(parsed("topk").ratio, 0.01);
  EXPECT_FALSE(parsed("topk:0.05,ef=off").error_feedback);
  const CodecSpec sign = parsed("sign,bucket=1024,ef=on");
  EXPECT_EQ(sign.name, "sign");
  EXPECT_EQ(sign.bucket, 1024u);
  EXPECT_TRUE(sign.error_feedback);
  EXPECT_EQ(parsed("topk:1").ratio, 1.0);
}

TEST(CodecSpec, CanonicalTextRoundTrips) {
  const std::vector<std::string> texts = {"none",
                                          "fp16",
                                          "bf16",
                                          "qsgd8",
                                          "qsgd4",
                                          "qsgd8,bucket=8",
                                          "qsgd4,bucket=16777216",
                                          "topk:0.01",
                                          "topk:0.3333",
                                          "topk:1e-05,ef=off",
                                          "sign",
                                          "sign,bucket=64,ef=off"};
  for (const std::string& text : texts) {
    const CodecSpec spec = parsed(text);
    EXPECT_EQ(toString(spec), text);
    EXPECT_EQ(parsed(toString(spec)), spec) << text;
  }
  EXPECT_EQ(toString(parsed("fp32")), "none");
  EXPECT_EQ(toString(parsed("topk")), "topk:0.01");
  EXPECT_EQ(toString(parsed("sign,ef=on,bucket=512")), "sign");
}

TEST(CodecSpec, RefusesMistakesWithClearMessages) {
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"", "unknown codec"},
      {"zip", "expected none, fp32, fp16"},
      {"qsgd", "unknown codec \"qsgd\""},
      {"qsgd2", "unknown codec"},
      {"QSGD8", "unknown codec"},
      {"topk:0", "not a number in (0, 1]"},
      {"topk:1.5", "not a number in (0, 1]"},
      {"topk:-0.1", "not a number in (0, 1]"},
      {"topk:abc", "not a number"},
      {"topk:nan", "not a number"},
      {"topk:0.1:2", "more than one ':'"},
      {"fp16:0.5", "only topk and lowrank take"},
      {"qsgd8,bucket=100", "multiple of 8"},
      {"qsgd8,bucket=0", "multiple of 8"},
      {"qsgd8,bucket=33554432", "multiple of 8"},
      {"qsgd8,bucket=-8", "multiple of 8"},
      {"qsgd8,bucket=", "multiple of 8"},
      {"qsgd8,bucket=64,bucket=64", "twice"},
      {"topk,bucket=64", "bucket applies to"},
      {"fp16,ef=on", "biased codecs"},
      {"qsgd8,ef=off", "biased codecs"},
      {"topk,ef=yes", "on or off"},
      {"sign,ef=on,ef=off", "twice"},
      {"sign,size=3", "unknown option \"size\""},
      {"sign,bucket", "not key=value"},
      {"sign,", "not key=value"},
  };
  for (const Case& c : cases) {
    const Result<CodecSpec> r = parseCodecSpec(c.text);
    ASSERT_FALSE(r.isOk()) << "accepted \"" << c.text << "\"";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr("\"" + c.text + "\"")) << "names the input";
  }
}

TEST(CodecSpec, ValidateChecksProgrammaticSpecs) {
  EXPECT_TRUE(validate(CodecSpec()).isOk());
  CodecSpec s;
  s.name = "gzip";
  EXPECT_FALSE(validate(s).isOk());
  s.name = "qsgd";
  s.bits = 2;
  EXPECT_THAT(validate(s).message(), HasSubstr("bits"));
  s.bits = 4;
  s.bucket = 12;
  EXPECT_THAT(validate(s).message(), HasSubstr("bucket"));
  s.bucket = 16;
  EXPECT_TRUE(validate(s).isOk());
  s.name = "topk";
  s.ratio = 0.0;
  EXPECT_THAT(validate(s).message(), HasSubstr("ratio"));
  s.ratio = 0.5;
  EXPECT_TRUE(validate(s).isOk());
}

TEST(CodecSpec, BiasAndErrorFeedback) {
  EXPECT_TRUE(isBiased(parsed("topk")));
  EXPECT_TRUE(isBiased(parsed("sign")));
  EXPECT_FALSE(isBiased(parsed("qsgd8")));
  EXPECT_FALSE(isBiased(parsed("fp16")));
  EXPECT_TRUE(usesErrorFeedback(parsed("topk")));
  EXPECT_FALSE(usesErrorFeedback(parsed("topk,ef=off")));
  EXPECT_FALSE(usesErrorFeedback(parsed("none")));  // error_feedback is true, but unbiased
}

TEST(CodecSpec, WarmupParsesAndRoundTrips) {
  EXPECT_EQ(parsed("topk").warmup, 0u);
  EXPECT_EQ(parsed("topk:0.01,warmup=4").warmup, 4u);
  EXPECT_EQ(parsed("topk:0.01,ef=off,warmup=16").warmup, 16u);
  EXPECT_EQ(toString(parsed("topk:0.01,warmup=0")), "topk:0.01");  // the default is left out
  EXPECT_EQ(toString(parsed("topk:0.01,warmup=2")), "topk:0.01,warmup=2");
  EXPECT_EQ(toString(parsed("topk:0.01,warmup=2,ef=off")), "topk:0.01,ef=off,warmup=2");
  for (const char* bad : {"qsgd8,warmup=1", "sign,warmup=1"}) {
    EXPECT_THAT(parseCodecSpec(bad).status().message(), HasSubstr("warmup applies to topk only"))
        << bad;
  }
  EXPECT_THAT(parseCodecSpec("topk,warmup=17").status().message(), HasSubstr("[0, 16]"));
  EXPECT_THAT(parseCodecSpec("topk,warmup=-1").status().message(), HasSubstr("whole number"));
  EXPECT_THAT(parseCodecSpec("topk,warmup=2,warmup=3").status().message(), HasSubstr("twice"));
  CodecSpec s = parsed("topk");
  s.warmup = 17;
  EXPECT_THAT(validate(s).message(), HasSubstr("warmup"));
}

TEST(CodecSpec, DenseBelowParsesRoundTripsAndNamesSmallTensors) {
  EXPECT_EQ(parsed("topk").dense_below, 0u);
  EXPECT_EQ(parsed("topk:0.01,dense_below=10000").dense_below, 10000u);
  EXPECT_EQ(toString(parsed("topk:0.01,dense_below=0")), "topk:0.01");  // the default
  EXPECT_EQ(toString(parsed("topk:0.01,dense_below=10000,ef=off,warmup=2")),
            "topk:0.01,ef=off,warmup=2,dense_below=10000");
  for (const char* bad : {"qsgd8,dense_below=8", "sign,dense_below=8", "fp16,dense_below=8"}) {
    EXPECT_THAT(parseCodecSpec(bad).status().message(), HasSubstr("dense_below applies to topk"))
        << bad;
  }
  EXPECT_THAT(parseCodecSpec("topk,dense_below=16777217").status().message(),
              HasSubstr("[0, 16777216]"));
  EXPECT_THAT(parseCodecSpec("topk,dense_below=1e4").status().message(), HasSubstr("whole number"));
  EXPECT_THAT(parseCodecSpec("topk,dense_below=1,dense_below=2").status().message(),
              HasSubstr("twice"));
  CodecSpec s = parsed("qsgd8");
  s.dense_below = 8;
  EXPECT_THAT(validate(s).message(), HasSubstr("dense_below"));
  EXPECT_FALSE(parseCodecSpec(toString(s)).isOk());  // the text names what the spec holds
  // Strictly below the bound; topk only; 0 names nothing.
  const CodecSpec t = parsed("topk:0.01,dense_below=5120");
  EXPECT_TRUE(denseBelow(t, 5119));
  EXPECT_FALSE(denseBelow(t, 5120));
  EXPECT_TRUE(denseBelow(t, 1));
  EXPECT_FALSE(denseBelow(parsed("topk:0.01"), 1));
  EXPECT_FALSE(denseBelow(parsed("qsgd8"), 1));
  // The residual means the same whatever the bound.
  EXPECT_EQ(residualKey(t), residualKey(parsed("topk:0.01")));
  EXPECT_EQ(codecForRound(parsed("topk:0.01,warmup=2,dense_below=64"), 1).dense_below, 64u);
}

// DGC's warm-up: rounds 1..W keep 2^(W - r + 1) x the ratio (capped at 1), then the ratio.
TEST(CodecSpec, CodecForRoundWarmsUpTopk) {
  const CodecSpec topk = parsed("topk:0.01,warmup=4");
  const double want[] = {0.16, 0.08, 0.04, 0.02, 0.01, 0.01};
  for (uint64_t r = 1; r <= 6; ++r) {
    const CodecSpec s = codecForRound(topk, r);
    EXPECT_DOUBLE_EQ(s.ratio, want[r - 1]) << r;
    EXPECT_EQ(s.warmup, 0u) << r;  // a concrete per-round codec
    EXPECT_TRUE(s.error_feedback);
  }
  EXPECT_EQ(toString(codecForRound(topk, 1)), "topk:0.16");
  EXPECT_EQ(toString(codecForRound(topk, 5)), "topk:0.01");
  // Capped at every element: 0.1 x 16 > 1; then 0.8, 0.4, 0.2.
  const CodecSpec dense = parsed("topk:0.1,warmup=4");
  EXPECT_DOUBLE_EQ(codecForRound(dense, 1).ratio, 1.0);
  EXPECT_DOUBLE_EQ(codecForRound(dense, 2).ratio, 0.8);
  EXPECT_DOUBLE_EQ(codecForRound(dense, 3).ratio, 0.4);
  EXPECT_DOUBLE_EQ(codecForRound(parsed("topk:0.01,warmup=2"), 1).ratio, 0.04);
  EXPECT_DOUBLE_EQ(codecForRound(parsed("topk:0.01,warmup=2"), 3).ratio, 0.01);
  // Off, and the other codecs: unchanged.
  EXPECT_EQ(codecForRound(parsed("topk:0.01"), 1), parsed("topk:0.01"));
  EXPECT_EQ(codecForRound(parsed("qsgd8"), 1), parsed("qsgd8"));
  EXPECT_EQ(codecForRound(parsed("sign"), 1), parsed("sign"));
  // The round-0 spec (no round yet) is the configured ratio.
  EXPECT_DOUBLE_EQ(codecForRound(topk, 0).ratio, 0.01);
}

// What a task's codec lets its update carry: the kind each spec's encoder writes, and fp16
// besides only for a topk spec with dense_below.
TEST(CodecSpec, AcceptsOnlyTheTasksPayloadKind) {
  const std::vector<std::pair<std::string, CodecKind>> own = {
      {"none", CodecKind::kNone},       {"fp32", CodecKind::kNone},
      {"fp16", CodecKind::kFp16},       {"bf16", CodecKind::kBf16},
      {"qsgd4", CodecKind::kQsgd},      {"qsgd8", CodecKind::kQsgd},
      {"topk", CodecKind::kTopk},       {"sign", CodecKind::kSign},
      {"lowrank", CodecKind::kLowrank}, {"topk:0.01,dense_below=100", CodecKind::kTopk}};
  const std::vector<CodecKind> kinds = {CodecKind::kNone,   CodecKind::kFp16, CodecKind::kBf16,
                                        CodecKind::kQsgd,   CodecKind::kTopk, CodecKind::kSign,
                                        CodecKind::kLowrank};
  for (const auto& [text, kind] : own) {
    SCOPED_TRACE(text);
    const CodecSpec spec = parseCodecSpec(text).value();
    EXPECT_EQ(payloadKind(spec), kind);
    const bool dense = text.find("dense_below") != std::string::npos;
    for (CodecKind k : kinds) {
      const bool want = k == kind || (dense && k == CodecKind::kFp16);
      EXPECT_EQ(acceptsPayload(spec, k), want) << codecKindName(k);
    }
  }
}

TEST(CodecSpec, ResidualKeyIgnoresRatioAndWarmup) {
  EXPECT_EQ(residualKey(parsed("topk:0.16")), residualKey(parsed("topk:0.01,warmup=4")));
  EXPECT_EQ(residualKey(parsed("topk:0.5")), "topk:0.01");
  EXPECT_NE(residualKey(parsed("topk:0.01,ef=off")), residualKey(parsed("topk:0.01")));
  EXPECT_NE(residualKey(parsed("sign")), residualKey(parsed("topk")));
  EXPECT_EQ(residualKey(parsed("sign,bucket=64")), "sign,bucket=64");
  EXPECT_TRUE(selectsPerTensor(parsed("topk")));
  EXPECT_FALSE(selectsPerTensor(parsed("sign")));
  EXPECT_FALSE(selectsPerTensor(parsed("qsgd8")));
}

}  // namespace
}  // namespace fedfleet::compress
