// ClientSession without a socket, a clock or a thread: event sequences in, actions out.
#include "client/client_session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "common/crypto/sha256.h"

namespace fedfleet::client {
namespace {

constexpr size_t kParams = 8;

std::string bytesOf(const std::vector<float>& v) {
  std::string s(v.size() * sizeof(float), '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

wire::Task makeTask(uint64_t token, uint32_t round = 1) {
  wire::Task t;
  t.round = round;
  t.model_name = "logreg";
  t.model_bytes = bytesOf(std::vector<float>(kParams, 0.5f));
  t.model_sha256 = crypto::sha256(t.model_bytes);
  t.task_token = token;
  t.deadline_s = 60;
  t.codec = "none";
  return t;
}

wire::Task scaffoldTask(uint64_t token) {
  wire::Task t = makeTask(token);
  t.hparams.scaffold = true;
  t.control_bytes = bytesOf(std::vector<float>(kParams, 0.25f));
  return t;
}

TrainingOutcome trained(std::vector<float> control_delta = {}) {
  TrainingOutcome o;
  o.partition_size = 100;
  o.steps = 3;
  o.mean_loss = 0.7;
  o.compute_seconds = 1.5;
  o.control_delta = std::move(control_delta);
  return o;
}

EncodedChunk chunk(uint64_t offset, uint64_t elements, bool last) {
  EncodedChunk c;
  c.range.offset = offset;
  c.range.elements = elements;
  c.payload = "payload";
  c.last = last;
  return c;
}

template <typename T>
std::vector<T> only(const std::vector<ClientAction>& actions) {
  std::vector<T> out;
  for (const auto& a : actions) {
    if (const T* x = std::get_if<T>(&a)) out.push_back(*x);
  }
  return out;
}

template <typename T>
bool is(const ClientAction& a) {
  return std::holds_alternative<T>(a);
}

class ClientSessionTest : public ::testing::Test {
 protected:
  ClientSession session_{ClientSessionOptions{}};

  // Task -> training -> done -> upload request; returns the request's token.
  void trainAndAsk(wire::Task task, TrainingOutcome outcome = trained()) {
    const uint64_t token = task.task_token;
    session_.onTask(receivedTask(std::move(task)), 0);
    auto a = session_.takeActions();
    ASSERT_EQ(a.size(), 1u);
    ASSERT_TRUE(is<StartTraining>(a[0]));
    session_.onTrainingDone(token, std::move(outcome), 2);
    a = session_.takeActions();
    ASSERT_EQ(a.size(), 1u);
    ASSERT_TRUE(is<SendUploadRequest>(a[0]));
    EXPECT_EQ(std::get<SendUploadRequest>(a[0]).request.task_token, token);
  }
};

TEST_F(ClientSessionTest, ATaskStartsTrainingWithItsModelAndCodec) {
  session_.onTask(receivedTask(makeTask(7)), 0);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  const auto& st = std::get<StartTraining>(a[0]);
  EXPECT_EQ(st.request->task.task_token, 7u);
  EXPECT_EQ(st.request->model_bytes->size(), kParams * sizeof(float));
  EXPECT_TRUE(st.request->task.model_bytes.empty());
  ASSERT_NE(st.request->codec, nullptr);
  EXPECT_EQ(session_.trainingToken(), 7u);
}

TEST_F(ClientSessionTest, TrainingDoneAsksForACreditAndChunksWaitForTheGrant) {
  trainAndAsk(makeTask(7));
  EXPECT_FALSE(session_.wantsChunk(7));  // no grant yet
  session_.onChunkEncoded(7, chunk(0, 4, false));
  session_.onChunkEncoded(7, chunk(4, 4, true));
  EXPECT_TRUE(session_.takeActions().empty());  // held until the grant

  session_.onUploadGrant(7, 10);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);  // one chunk at a time
  const wire::Chunk c0 = std::get<SendChunk>(a[0]).chunk;
  EXPECT_EQ(c0.task_token, 7u);
  EXPECT_EQ(c0.offset, 0u);
  EXPECT_EQ(c0.n_samples, 100u);
  EXPECT_EQ(c0.steps, 3u);
  EXPECT_FALSE(c0.last);

  session_.onChunkSent(7, 11);
  a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(std::get<SendChunk>(a[0]).chunk.offset, 4u);
  EXPECT_TRUE(std::get<SendChunk>(a[0]).chunk.last);

  session_.onChunkSent(7, 12.5);
  a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  const wire::Summary s = std::get<SendSummary>(a[0]).summary;
  EXPECT_EQ(s.task_token, 7u);
  EXPECT_EQ(s.n_samples, 100u);
  EXPECT_EQ(s.steps, 3u);
  EXPECT_DOUBLE_EQ(s.compute_seconds, 1.5);
  EXPECT_DOUBLE_EQ(s.upload_seconds, 2.5);  // from the grant, not from the request
  EXPECT_FALSE(session_.holdsUpload(7));
}

TEST_F(ClientSessionTest, AGrantForAnotherTokenSendsNothing) {
  trainAndAsk(makeTask(7));
  session_.onChunkEncoded(7, chunk(0, 8, true));
  session_.onUploadGrant(8, 1);
  EXPECT_TRUE(session_.takeActions().empty());
}

TEST_F(ClientSessionTest, CancelMidUploadAbandonsItAndSendsNothingMore) {
  trainAndAsk(makeTask(7));
  session_.onUploadGrant(7, 3);
  session_.onChunkEncoded(7, chunk(0, 4, false));
  ASSERT_EQ(only<SendChunk>(session_.takeActions()).size(), 1u);
  session_.onChunkSent(7, 4);
  session_.onCancel(wire::Cancel{7, "round over"}, 5);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  const auto& ab = std::get<AbandonUpload>(a[0]);
  EXPECT_EQ(ab.token, 7u);
  EXPECT_TRUE(ab.encoding_started);
  EXPECT_EQ(ab.chunks_sent, 1u);
  EXPECT_NE(ab.why.find("round over"), std::string::npos);
  session_.onChunkEncoded(7, chunk(4, 4, true));
  session_.onChunkSent(7, 6);
  EXPECT_TRUE(session_.takeActions().empty());
}

TEST_F(ClientSessionTest, CancelWhileTrainingAbandonsTheTrainingAndItsLateResult) {
  session_.onTask(receivedTask(makeTask(7)), 0);
  session_.takeActions();
  session_.onCancel(wire::Cancel{7, "late"}, 1);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(std::get<AbandonTraining>(a[0]).token, 7u);
  session_.onTrainingDone(7, trained(), 2);  // a result after the cancel is never uploaded
  EXPECT_TRUE(session_.takeActions().empty());
}

TEST_F(ClientSessionTest, ANewTaskAbandonsTheTaskInTraining) {
  session_.onTask(receivedTask(makeTask(7)), 0);
  session_.takeActions();
  session_.onTask(receivedTask(makeTask(8, 2)), 1);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(std::get<AbandonTraining>(a[0]).token, 7u);
  EXPECT_EQ(std::get<StartTraining>(a[1]).request->task.task_token, 8u);
  session_.onTrainingDone(7, trained(), 2);  // the old token: ignored
  EXPECT_TRUE(session_.takeActions().empty());
}

// The coordinator sends a task again when the client's connection was replaced before its
// upload started: the task held goes on, in training or in upload.
TEST_F(ClientSessionTest, ATaskSentAgainIsIgnoredInTrainingAndInUpload) {
  session_.onTask(receivedTask(makeTask(7)), 0);
  ASSERT_EQ(only<StartTraining>(session_.takeActions()).size(), 1u);
  session_.onTask(receivedTask(makeTask(7)), 1);
  EXPECT_TRUE(session_.takeActions().empty());
  EXPECT_EQ(session_.trainingToken(), 7u);
  session_.onTrainingDone(7, trained(), 2);
  ASSERT_EQ(only<SendUploadRequest>(session_.takeActions()).size(), 1u);
  session_.onTask(receivedTask(makeTask(7)), 3);
  EXPECT_TRUE(session_.takeActions().empty());
  EXPECT_TRUE(session_.holdsUpload(7));
  EXPECT_FALSE(session_.trainingToken().has_value());
  // Once the upload is done the token is no longer held.
  session_.onUploadGrant(7, 4);
  session_.onChunkEncoded(7, chunk(0, kParams, true));
  ASSERT_EQ(only<SendChunk>(session_.takeActions()).size(), 1u);
  session_.onChunkSent(7, 5);
  ASSERT_EQ(only<SendSummary>(session_.takeActions()).size(), 1u);
  EXPECT_FALSE(session_.holdsUpload(7));
}

TEST_F(ClientSessionTest, ATaskOfANewCoordinatorSessionDropsTheOldSessionsUpload) {
  wire::Task t = makeTask(7);
  t.coordinator_session = 1;
  trainAndAsk(std::move(t));
  wire::Task next = makeTask(8, 2);
  next.coordinator_session = 2;
  session_.onTask(receivedTask(std::move(next)), 3);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(std::get<AbandonUpload>(a[0]).token, 7u);
  EXPECT_TRUE(is<StartTraining>(a[1]));
}

TEST_F(ClientSessionTest, AnErrorAboutAStaleTokenAbandonsThatUploadOnly) {
  trainAndAsk(makeTask(7));
  session_.onCoordinatorError(wire::Error{wire::ErrorCode::kStaleTask, "stale", 99}, 1);
  EXPECT_TRUE(session_.takeActions().empty());
  EXPECT_TRUE(session_.holdsUpload(7));
  session_.onCoordinatorError(wire::Error{wire::ErrorCode::kStaleTask, "stale", 7}, 1);
  EXPECT_EQ(only<AbandonUpload>(session_.takeActions()).size(), 1u);
  EXPECT_FALSE(session_.holdsUpload(7));
}

TEST_F(ClientSessionTest, AnUnknownClientErrorLeavesTheWorkToTheDriversHello) {
  trainAndAsk(makeTask(7));
  session_.onCoordinatorError(wire::Error{wire::ErrorCode::kUnknownClient, "who", 7}, 1);
  EXPECT_TRUE(session_.takeActions().empty());
  session_.onReconnected(2);  // the upload still waits for its grant: it asks again
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(std::get<SendUploadRequest>(a[0]).request.task_token, 7u);
}

TEST_F(ClientSessionTest, AModelThatDoesNotMatchItsChecksumIsRefusedNotTrained) {
  wire::Task t = makeTask(7);
  t.model_bytes[0] ^= 1;
  session_.onTask(receivedTask(std::move(t)), 0);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  const auto& e = std::get<SendError>(a[0]).error;
  EXPECT_EQ(e.code, wire::ErrorCode::kRejected);
  EXPECT_EQ(e.task_token, 7u);
  EXPECT_EQ(e.message, "model bytes do not match their SHA-256");
  EXPECT_FALSE(session_.trainingToken());
}

TEST_F(ClientSessionTest, AnUnknownCodecIsRefusedNotTrained) {
  wire::Task t = makeTask(7);
  t.codec = "zip9";
  session_.onTask(receivedTask(std::move(t)), 0);
  auto e = only<SendError>(session_.takeActions());
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].error.code, wire::ErrorCode::kRejected);
  EXPECT_EQ(e[0].error.message.rfind("codec: ", 0), 0u);
}

TEST_F(ClientSessionTest, ACorruptAttachedServedModelIsRefusedNotTrained) {
  wire::Task t = makeTask(7);
  t.served.source = wire::ServedSource::kAttached;
  t.served.bytes = bytesOf(std::vector<float>(kParams, 2.0f));
  t.served.sha256 = crypto::sha256(t.served.bytes);
  t.served.bytes[3] ^= 4;  // damaged on the way
  session_.onTask(receivedTask(std::move(t)), 0);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  const auto& e = std::get<SendError>(a[0]).error;
  EXPECT_EQ(e.code, wire::ErrorCode::kRejected);
  EXPECT_NE(e.message.find("do not match their SHA-256"), std::string::npos);
  EXPECT_TRUE(session_.servedModel().empty());
  EXPECT_FALSE(session_.trainingToken());
}

TEST_F(ClientSessionTest, AServedModelIsPublishedEvaluatedOnceAndReported) {
  wire::Task t = makeTask(7);
  t.served.source = wire::ServedSource::kTaskModel;
  t.served.sha256 = t.model_sha256;
  session_.onTask(receivedTask(t), 0);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(is<PublishServedModel>(a[0]));
  const auto& req = *std::get<StartTraining>(a[1]).request;
  ASSERT_NE(req.served_to_evaluate, nullptr);
  EXPECT_EQ(req.served_sha, t.model_sha256);
  TrainingOutcome o = trained();
  o.served_evaluation = ServedEvaluation{50, 0.4, 0.8};
  session_.onTrainingDone(7, std::move(o), 1);
  session_.takeActions();
  session_.onUploadGrant(7, 1);
  session_.onChunkEncoded(7, chunk(0, kParams, true));
  session_.takeActions();
  session_.onChunkSent(7, 2);
  auto s = only<SendSummary>(session_.takeActions());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].summary.served_sha256, t.model_sha256);
  EXPECT_EQ(s[0].summary.served_samples, 50u);
  EXPECT_DOUBLE_EQ(s[0].summary.served_accuracy, 0.8);

  wire::Task again = makeTask(8, 2);
  again.served.source = wire::ServedSource::kUnchanged;
  again.served.sha256 = t.model_sha256;
  session_.onTask(receivedTask(std::move(again)), 3);
  a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);  // no publish: nothing changed
  EXPECT_EQ(std::get<StartTraining>(a[0]).request->served_to_evaluate, nullptr);  // known
}

TEST_F(ClientSessionTest, PartialWorkIsStoppedAtStopAfterAndUploaded) {
  wire::Task t = makeTask(7);
  t.hparams.stop_after_s = 5;
  session_.onTask(receivedTask(std::move(t)), 0);
  session_.takeActions();
  EXPECT_EQ(session_.nextWakeup(), 5.0);
  session_.onTimePassed(4.9);
  EXPECT_TRUE(session_.takeActions().empty());
  session_.onTimePassed(5);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(std::get<StopTraining>(a[0]).token, 7u);
  TrainingOutcome o = trained();
  o.stopped_early = true;
  session_.onTrainingDone(7, std::move(o), 5.1);
  EXPECT_EQ(only<SendUploadRequest>(session_.takeActions()).size(), 1u);
}

TEST_F(ClientSessionTest, StoppedBeforeTheFirstStepIsAnErrorNotAnUpload) {
  wire::Task t = makeTask(7);
  t.hparams.stop_after_s = 1;
  session_.onTask(receivedTask(std::move(t)), 0);
  session_.onTimePassed(1);
  session_.takeActions();
  TrainingOutcome o = trained();
  o.stopped_early = true;
  o.steps = 0;
  session_.onTrainingDone(7, std::move(o), 1.1);
  auto e = only<SendError>(session_.takeActions());
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].error.code, wire::ErrorCode::kInternal);
  EXPECT_FALSE(session_.holdsUpload(7));
}

TEST_F(ClientSessionTest, TheDeadlineAbandonsTrainingAndUploads) {
  session_.onTask(receivedTask(makeTask(7)), 0);
  session_.takeActions();
  session_.onTimePassed(60.5);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(std::get<AbandonTraining>(a[0]).why, "deadline passed");
  trainAndAsk(makeTask(8));
  session_.onTimePassed(61);  // received at 0: past its 60 s
  EXPECT_EQ(only<AbandonUpload>(session_.takeActions()).size(), 1u);
}

TEST_F(ClientSessionTest, ATrainingFailureIsReportedAsInternal) {
  session_.onTask(receivedTask(makeTask(7)), 0);
  session_.takeActions();
  TrainingOutcome o;
  o.status = internalError("out of memory");
  session_.onTrainingDone(7, std::move(o), 1);
  auto e = only<SendError>(session_.takeActions());
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].error.code, wire::ErrorCode::kInternal);
  EXPECT_EQ(e[0].error.message, "out of memory");
}

TEST_F(ClientSessionTest, UploadsGoOutOneAfterTheOtherInTheOrderTheyFinished) {
  trainAndAsk(makeTask(7));
  // A second task trains while the first upload waits (asynchronous mode) and queues behind.
  session_.onTask(receivedTask(makeTask(8, 2)), 3);
  session_.takeActions();
  session_.onTrainingDone(8, trained(), 4);
  EXPECT_TRUE(session_.takeActions().empty());  // behind 7: it does not ask yet
  EXPECT_EQ(session_.uploadsQueued(), 2u);
  session_.onUploadGrant(7, 5);
  session_.onChunkEncoded(7, chunk(0, kParams, true));
  session_.takeActions();
  session_.onChunkSent(7, 6);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(std::get<SendSummary>(a[0]).summary.task_token, 7u);
  EXPECT_EQ(std::get<SendUploadRequest>(a[1]).request.task_token, 8u);
}

TEST_F(ClientSessionTest, AnEncodingFailureIsReportedAndTheUploadAbandoned) {
  trainAndAsk(makeTask(7));
  session_.onEncodingFailed(7, invalidArgument("a value is not finite"));
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(std::get<SendError>(a[0]).error.code, wire::ErrorCode::kInternal);
  EXPECT_TRUE(is<AbandonUpload>(a[1]));
}

// A client with a local DP floor (client.local_dp_min_noise) refuses, naming the key, a task
// that asks for no local DP or for less noise than the floor, and trains one at or above it.
TEST(ClientSessionLocalDpFloorTest, ATaskBelowTheFloorIsRefusedNotTrained) {
  ClientSessionOptions o;
  o.local_dp_min_noise = 1.0;
  ClientSession session(o);
  const auto refusal = [&session](wire::LocalDpTask dp, uint64_t token) -> std::string {
    wire::Task t = makeTask(token);
    t.local_dp = dp;
    session.onTask(receivedTask(std::move(t)), 0);
    auto a = session.takeActions();
    if (a.size() != 1 || !is<SendError>(a[0])) return "";
    const wire::Error& e = std::get<SendError>(a[0]).error;
    EXPECT_EQ(e.code, wire::ErrorCode::kRejected);
    EXPECT_EQ(e.task_token, token);
    EXPECT_FALSE(session.trainingToken());
    return e.message;
  };
  const std::string off = refusal({}, 7);
  EXPECT_NE(off.find("client.local_dp_min_noise"), std::string::npos) << off;
  EXPECT_NE(off.find("has none"), std::string::npos) << off;
  const std::string weak = refusal({/*clip=*/1.0, /*noise_multiplier=*/0.5, 1e-5}, 8);
  EXPECT_NE(weak.find("client.local_dp_min_noise"), std::string::npos) << weak;
  EXPECT_NE(weak.find("0.5 is below"), std::string::npos) << weak;
  const std::string unclipped = refusal({INFINITY, 2.0, 1e-5}, 9);
  EXPECT_NE(unclipped.find("client.local_dp_min_noise"), std::string::npos) << unclipped;

  for (double z : {1.0, 2.5}) {
    wire::Task t = makeTask(10);
    t.local_dp = {1.0, z, 1e-5};
    session.onTask(receivedTask(std::move(t)), 0);
    auto a = session.takeActions();
    ASSERT_EQ(a.size(), 1u) << "z = " << z;
    EXPECT_TRUE(is<StartTraining>(a[0])) << "z = " << z;
    EXPECT_EQ(session.trainingToken(), 10u);
    session.onCancel(wire::Cancel{10, "next"}, 1);
    session.takeActions();
  }
}

TEST(ClientSessionLocalDpFloorTest, WithoutAFloorATaskWithoutLocalDpTrains) {
  ClientSession session{ClientSessionOptions{}};
  session.onTask(receivedTask(makeTask(7)), 0);
  auto a = session.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_TRUE(is<StartTraining>(a[0]));
}

class ClientSessionScaffoldTest : public ClientSessionTest {
 protected:
  // Uploads task `token` with Dc_k = `delta` up to its Summary.
  void uploadUpToTheSummary(uint64_t token, float delta) {
    trainAndAsk(scaffoldTask(token), trained(std::vector<float>(kParams, delta)));
    session_.onUploadGrant(token, 3);
    session_.onChunkEncoded(token, chunk(0, 2 * kParams, true));
    session_.takeActions();
    session_.onChunkSent(token, 4);
    ASSERT_EQ(only<SendSummary>(session_.takeActions()).size(), 1u);
  }
  std::vector<float> ck() const { return session_.controlVariate()->values(); }
};

TEST_F(ClientSessionScaffoldTest, ATaskTrainsWithServerCAndACopyOfCk) {
  session_.onTask(receivedTask(scaffoldTask(7)), 0);
  auto a = session_.takeActions();
  const auto& req = *std::get<StartTraining>(a[0]).request;
  ASSERT_NE(req.control_c, nullptr);
  EXPECT_EQ(floatsOf(*req.control_c), std::vector<float>(kParams, 0.25f));
  EXPECT_EQ(req.control_ck, std::vector<float>(kParams, 0.0f));
}

TEST_F(ClientSessionScaffoldTest, CkIsCommittedOnceTheSummaryIsDelivered) {
  uploadUpToTheSummary(7, 0.5f);
  EXPECT_EQ(ck(), std::vector<float>(kParams, 0.0f));  // sent, not yet delivered
  session_.onSummaryDelivered(7);
  auto a = session_.takeActions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_TRUE(is<ControlVariateCommitted>(a[0]));
  EXPECT_EQ(ck(), std::vector<float>(kParams, 0.5f));
  // The next task trains with the committed c_k.
  session_.onTask(receivedTask(scaffoldTask(8)), 5);
  a = session_.takeActions();
  EXPECT_EQ(std::get<StartTraining>(a[0]).request->control_ck, std::vector<float>(kParams, 0.5f));
}

TEST_F(ClientSessionScaffoldTest, ARejectedUpdateIsNeverCommitted) {
  // Rejected mid-upload: the Error abandons it before its Summary.
  trainAndAsk(scaffoldTask(7), trained(std::vector<float>(kParams, 0.5f)));
  session_.onUploadGrant(7, 3);
  session_.onChunkEncoded(7, chunk(0, kParams, false));
  session_.takeActions();
  session_.onCoordinatorError(wire::Error{wire::ErrorCode::kRejected, "bad chunk", 7}, 4);
  session_.takeActions();
  session_.onChunkSent(7, 4);
  session_.onSummaryDelivered(7);
  EXPECT_TRUE(only<ControlVariateCommitted>(session_.takeActions()).empty());
  EXPECT_EQ(ck(), std::vector<float>(kParams, 0.0f));

  // Cancelled after its Summary left but before the coordinator had it.
  uploadUpToTheSummary(8, 0.5f);
  session_.onCancel(wire::Cancel{8, "late"}, 5);
  session_.onSummaryDelivered(8);
  EXPECT_TRUE(only<ControlVariateCommitted>(session_.takeActions()).empty());
  EXPECT_EQ(ck(), std::vector<float>(kParams, 0.0f));
}

TEST_F(ClientSessionScaffoldTest, AControlVariateOfTheWrongSizeIsRefused) {
  wire::Task t = scaffoldTask(7);
  t.control_bytes.resize(4);
  session_.onTask(receivedTask(std::move(t)), 0);
  auto e = only<SendError>(session_.takeActions());
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].error.code, wire::ErrorCode::kRejected);
  EXPECT_EQ(session_.controlVariate(), nullptr);
}

TEST(ClientSessionLoadTest, TheFirstScaffoldTaskLoadsCk) {
  ClientSessionOptions o;
  size_t asked = 0;
  o.load_control = [&asked](size_t n) {
    asked = n;
    ControlVariate c(n);
    c.apply(std::vector<float>(n, 1.0f));
    return c;
  };
  ClientSession session(o);
  session.onTask(receivedTask(scaffoldTask(7)), 0);
  auto a = session.takeActions();
  EXPECT_EQ(asked, kParams);
  EXPECT_EQ(std::get<StartTraining>(a[0]).request->control_ck, std::vector<float>(kParams, 1.0f));
}

}  // namespace
}  // namespace fedfleet::client
