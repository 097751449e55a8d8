// The simulator's worker jobs as bytes (common/wire/sim_job.h): every field survives the trip,
// and bytes that are not a job (or not a result) come back as a Status.
#include "common/wire/sim_job.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

namespace fedfleet::wire {
namespace {

std::shared_ptr<const std::string> floatBytes(std::initializer_list<float> v) {
  return std::make_shared<const std::string>(reinterpret_cast<const char*>(v.begin()),
                                             v.size() * sizeof(float));
}

SimModelRecipe recipe() { return {"cnn", "/models/x.pt", 77, {1, 28, 28}, 10, Loss::kMse, "cuda"}; }

TEST(SimJob, ATrainingJobKeepsEveryField) {
  SimTrainJob j;
  j.client = 123456789012ull;
  j.recipe = recipe();
  j.epochs = 3;
  j.max_steps = 17;
  j.batch_size = 64;
  j.lr = 0.125f;
  j.momentum = 0.9f;
  j.weight_decay = 1e-4f;
  j.prox_mu = 0.01f;
  j.optimizer = Optimizer::kAdamW;
  j.seed = 0xdeadbeefcafef00dull;
  j.start = floatBytes({1.5f, -2.25f, 3.0f});
  j.scaffold = true;
  j.control_c = floatBytes({0.5f, 0.25f, -1.0f});
  j.control_ck = {0.1f, -0.2f, 0.3f};
  j.fed_eval = true;
  j.served = floatBytes({9.0f, 8.0f, 7.0f});
  j.precision = Precision::kBf16;
  auto back = decodeSimJob(encodeSimJob(j));
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  const auto& t = std::get<SimTrainJob>(*back);
  EXPECT_EQ(t.client, j.client);
  EXPECT_EQ(t.recipe.name, "cnn");
  EXPECT_EQ(t.recipe.path, "/models/x.pt");
  EXPECT_EQ(t.recipe.seed, 77u);
  EXPECT_EQ(t.recipe.sample_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(t.recipe.classes, 10);
  EXPECT_EQ(t.recipe.loss, Loss::kMse);
  EXPECT_EQ(t.recipe.device, "cuda");
  EXPECT_EQ(t.epochs, 3u);
  EXPECT_EQ(t.max_steps, 17u);
  EXPECT_EQ(t.batch_size, 64u);
  EXPECT_EQ(t.lr, 0.125f);
  EXPECT_EQ(t.momentum, 0.9f);
  EXPECT_EQ(t.weight_decay, 1e-4f);
  EXPECT_EQ(t.prox_mu, 0.01f);
  EXPECT_EQ(t.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(t.seed, j.seed);
  EXPECT_EQ(*t.start, *j.start);
  EXPECT_TRUE(t.scaffold);
  EXPECT_EQ(*t.control_c, *j.control_c);
  EXPECT_EQ(t.control_ck, j.control_ck);
  EXPECT_TRUE(t.fed_eval);
  ASSERT_TRUE(t.served);
  EXPECT_EQ(*t.served, *j.served);
  EXPECT_EQ(t.precision, Precision::kBf16);
}

TEST(SimJob, NoServedModelStaysNone) {
  SimTrainJob j;
  j.start = floatBytes({1.0f});
  auto back = decodeSimJob(encodeSimJob(j));
  ASSERT_TRUE(back.isOk());
  const auto& t = std::get<SimTrainJob>(*back);
  EXPECT_EQ(t.served, nullptr);
  EXPECT_FALSE(t.scaffold);
  EXPECT_EQ(t.control_c, nullptr);
  EXPECT_EQ(t.precision, Precision::kFp32);
}

TEST(SimJob, AnEvaluationJobAndItsResultKeepEveryField) {
  SimEvalJob j{recipe(), floatBytes({4.0f, 5.0f}), 250, 2250, 250};
  auto back = decodeSimJob(encodeSimJob(j));
  ASSERT_TRUE(back.isOk());
  const auto& e = std::get<SimEvalJob>(*back);
  EXPECT_EQ(*e.params, *j.params);
  EXPECT_EQ(e.begin, 250u);
  EXPECT_EQ(e.end, 2250u);
  EXPECT_EQ(e.piece, 250u);

  SimEvalResult r;
  r.pieces.push_back({250, 123.456789012345, 201, true, {{"mae", 0.5}, {"mse", 1.0 / 3}}});
  r.pieces.push_back({17, 1e-300, 0, false, {}});
  auto rb = decodeSimJobResult(encodeSimJobResult(r));
  ASSERT_TRUE(rb.isOk()) << rb.status().toString();
  const auto& got = std::get<SimEvalResult>(*rb);
  ASSERT_TRUE(got.status.isOk());
  ASSERT_EQ(got.pieces.size(), 2u);
  EXPECT_EQ(got.pieces[0].n, 250u);
  EXPECT_EQ(got.pieces[0].loss_sum, 123.456789012345);  // bit for bit
  EXPECT_EQ(got.pieces[0].correct, 201u);
  EXPECT_TRUE(got.pieces[0].has_accuracy);
  EXPECT_EQ(got.pieces[0].metric_sums, r.pieces[0].metric_sums);
  EXPECT_EQ(got.pieces[1].loss_sum, 1e-300);
  EXPECT_FALSE(got.pieces[1].has_accuracy);
}

TEST(SimJob, ATrainingResultKeepsItsNumbersAndItsFailures) {
  SimTrainResult r;
  r.steps = 19;
  r.stopped_early = true;
  r.mean_loss = 0.693147180559945;
  r.sum_sq_loss = 12.5;
  r.delta = {1.0f, -0.0f, std::nextafter(1.0f, 2.0f)};
  r.control_delta = {0.25f};
  SimEvaluation fed;
  fed.n = 40;
  fed.loss = 1.25;
  fed.accuracy = 0.75;
  fed.metrics = {{"mae", 0.1}};
  r.fed_evaluation = fed;
  SimEvaluation served;
  served.status = Status(StatusCode::kInvalidArgument, "no held-out data");
  r.served_evaluation = served;
  r.wall_seconds = 0.5;
  auto back = decodeSimJobResult(encodeSimJobResult(r));
  ASSERT_TRUE(back.isOk());
  const auto& t = std::get<SimTrainResult>(*back);
  EXPECT_TRUE(t.status.isOk());
  EXPECT_EQ(t.steps, 19u);
  EXPECT_TRUE(t.stopped_early);
  EXPECT_EQ(t.mean_loss, r.mean_loss);
  EXPECT_EQ(t.sum_sq_loss, 12.5);
  ASSERT_EQ(t.delta.size(), 3u);
  EXPECT_TRUE(std::signbit(t.delta[1]));
  EXPECT_EQ(t.delta[2], r.delta[2]);
  EXPECT_EQ(t.control_delta, r.control_delta);
  ASSERT_TRUE(t.fed_evaluation);
  EXPECT_EQ(t.fed_evaluation->n, 40u);
  EXPECT_EQ(t.fed_evaluation->accuracy, 0.75);
  EXPECT_EQ(t.fed_evaluation->metrics, fed.metrics);
  ASSERT_TRUE(t.served_evaluation);
  EXPECT_EQ(t.served_evaluation->status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.served_evaluation->status.message(), "no held-out data");
  EXPECT_FALSE(t.served_evaluation->accuracy);

  SimTrainResult failed;
  failed.status = Status(StatusCode::kInternal, "out of memory");
  auto fb = decodeSimJobResult(encodeSimJobResult(failed));
  ASSERT_TRUE(fb.isOk());
  EXPECT_EQ(std::get<SimTrainResult>(*fb).status.code(), StatusCode::kInternal);
  EXPECT_EQ(std::get<SimTrainResult>(*fb).status.message(), "out of memory");
}

TEST(SimJob, BytesThatAreNotAJobAreRefused) {
  SimTrainJob j;
  j.start = floatBytes({1.0f, 2.0f});
  const std::string bytes = encodeSimJob(j);
  // A result where a job is expected, and the other way round.
  EXPECT_EQ(decodeSimJobResult(bytes).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(decodeSimJob(encodeSimJobResult(SimTrainResult{})).status().code(),
            StatusCode::kCorrupt);
  // Truncated, empty, not whole words, over the limit.
  EXPECT_FALSE(decodeSimJob(bytes.substr(0, bytes.size() - 8)).isOk());
  EXPECT_EQ(decodeSimJob("").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(decodeSimJob(bytes.substr(0, 7)).status().code(), StatusCode::kCorrupt);
  DecodeLimits tight;
  tight.max_bytes = 16;
  EXPECT_EQ(decodeSimJob(bytes, tight).status().code(), StatusCode::kResourceExhausted);
  // A model that is not a whole number of floats.
  SimTrainJob odd;
  odd.start = std::make_shared<const std::string>("abcde");
  auto r = decodeSimJob(encodeSimJob(odd));
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("whole number of floats"), std::string::npos);
  // A precision no worker knows.
  SimTrainJob unknown;
  unknown.start = floatBytes({1.0f});
  unknown.precision = static_cast<Precision>(2);
  auto u = decodeSimJob(encodeSimJob(unknown));
  EXPECT_EQ(u.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(u.status().message().find("precision"), std::string::npos);
  // An evaluation of a range that ends before it starts.
  SimEvalJob backwards{recipe(), floatBytes({1.0f}), 10, 5, 250};
  EXPECT_EQ(decodeSimJob(encodeSimJob(backwards)).status().code(), StatusCode::kCorrupt);
}

// Found by the wire fuzzer: 128 bytes whose lists claim millions of zero-sized elements, which
// decoded to a result that encodes to over 400 MB. Every list now draws on the bytes that carry
// the message, so such bytes are refused before anything is built.
TEST(SimJob, ListsThatClaimMoreThanTheirBytesAreRefused) {
  for (const char* name : {"sim_list_amplification", "sim_list_amplification_2"}) {
    std::ifstream in(std::string(FEDFLEET_SOURCE_DIR) + "/fuzz/corpus/wire/" + name,
                     std::ios::binary);
    const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(seed.size(), 1u) << name;
    ASSERT_EQ(seed[0] & 1, 0) << name;  // the fuzzer's control byte: one frame follows
    const std::string_view frame(seed.data() + 1, seed.size() - 1);
    auto result = decodeSimJobResult(frame);  // an evaluation result: pieces or metrics
    ASSERT_FALSE(result.isOk()) << name;
    EXPECT_EQ(result.status().code(), StatusCode::kCorrupt) << name;
    EXPECT_NE(result.status().message().find("bytes can hold"), std::string::npos)
        << result.status().message();
  }
}

}  // namespace
}  // namespace fedfleet::wire
