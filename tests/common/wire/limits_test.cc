// Tests of common/wire/limits.cc: every bounded field of a client message passes at its limit and
// is refused one past it, with kInvalidArgument naming the field, its size and the limit; the
// character sets of the id, key and device name; the messages a client never sends.

#include "common/wire/limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/wire/messages.h"

namespace fedfleet::wire {
namespace {

using ::testing::HasSubstr;

constexpr const char* kKey = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";

Hello validHello() {
  Hello m;
  m.client_id = "client-0042";
  m.public_key = kKey;
  m.device_name = "NVIDIA H200";
  m.cores = 96;
  return m;
}

// A field bounded in length: the message with the field `size` bytes long.
struct LengthCase {
  const char* field;
  size_t limit;
  std::function<Message(size_t size)> make;
};

void PrintTo(const LengthCase& c, std::ostream* os) { *os << c.field; }

class LengthLimitTest : public ::testing::TestWithParam<LengthCase> {};

TEST_P(LengthLimitTest, PassesAtTheLimitAndFailsOnePastItNamingTheField) {
  const LengthCase& c = GetParam();
  EXPECT_TRUE(checkClientMessage(c.make(c.limit)).isOk()) << c.field;

  const Status over = checkClientMessage(c.make(c.limit + 1));
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(over.message(), HasSubstr(c.field));
  EXPECT_THAT(over.message(), HasSubstr(std::to_string(c.limit + 1) + " bytes"));
  EXPECT_THAT(over.message(), HasSubstr("limit " + std::to_string(c.limit)));
}

// The case of the incident this guards against: a 20 MiB device name.
TEST_P(LengthLimitTest, FailsTwentyMebibytes) {
  const LengthCase& c = GetParam();
  const Status st = checkClientMessage(c.make(20 << 20));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr(std::string(c.field) + " is 20971520 bytes"));
}

INSTANTIATE_TEST_SUITE_P(
    ClientFields, LengthLimitTest,
    ::testing::Values(LengthCase{"Hello.client_id", kMaxClientIdBytes,
                                 [](size_t n) {
                                   Hello m = validHello();
                                   m.client_id = std::string(n, 'a');
                                   return Message(m);
                                 }},
                      LengthCase{"Hello.device_name", kMaxDeviceNameBytes,
                                 [](size_t n) {
                                   Hello m = validHello();
                                   m.device_name = std::string(n, 'x');
                                   return Message(m);
                                 }},
                      LengthCase{"Bye.reason", kMaxReasonBytes,
                                 [](size_t n) { return Message(Bye{std::string(n, 'r')}); }},
                      LengthCase{
                          "Error.message", kMaxReasonBytes,
                          [](size_t n) {
                            return Message(Error{ErrorCode::kRejected, std::string(n, 'e'), 7});
                          }}),
    [](const ::testing::TestParamInfo<LengthCase>& info) {
      std::string name = info.param.field;
      name.erase(name.find('.'), 1);
      name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
      return name;
    });

TEST(ClientIdTest, EmptyFails) {
  Hello m = validHello();
  m.client_id.clear();
  const Status st = checkClientMessage(m);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("Hello.client_id is empty"));
}

TEST(ClientIdTest, EveryAllowedCharacterPasses) {
  Hello m = validHello();
  m.client_id = "AZaz09._@-";
  EXPECT_TRUE(checkClientMessage(m).isOk());
}

TEST(ClientIdTest, OtherCharactersFailNamingTheByteAndPosition) {
  for (const std::string& bad :
       std::vector<std::string>{"a b", "a/b", "a\nb", std::string("a\0b", 3), "a\xc3\xa9"}) {
    Hello m = validHello();
    m.client_id = bad;
    const Status st = checkClientMessage(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr("Hello.client_id"));
    EXPECT_THAT(st.message(), HasSubstr("at 1"));
  }
}

TEST(PublicKeyTest, EmptyAndFortyZ85CharactersPass) {
  Hello m = validHello();
  EXPECT_TRUE(checkClientMessage(m).isOk());
  m.public_key.clear();
  EXPECT_TRUE(checkClientMessage(m).isOk());
}

TEST(PublicKeyTest, OtherLengthsFail) {
  for (size_t n : {size_t{1}, kPublicKeyChars - 1, kPublicKeyChars + 1, size_t{4096}}) {
    Hello m = validHello();
    m.public_key = std::string(n, 'a');
    const Status st = checkClientMessage(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(st.message(), HasSubstr("Hello.public_key is " + std::to_string(n) + " bytes"));
    EXPECT_THAT(st.message(), HasSubstr("must be empty or 40"));
  }
}

TEST(PublicKeyTest, ACharacterOutsideZ85Fails) {
  for (char bad : {' ', '"', '\'', ',', ';', '\\', '_', '`', '|', '~', '\0'}) {
    Hello m = validHello();
    m.public_key[39] = bad;
    const Status st = checkClientMessage(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr("Hello.public_key"));
    EXPECT_THAT(st.message(), HasSubstr("at 39, not in the Z85 alphabet"));
  }
}

TEST(DeviceNameTest, EmptyAndPrintableAsciiPass) {
  Hello m = validHello();
  m.device_name = " !~AMD EPYC 9654 96-Core Processor";
  EXPECT_TRUE(checkClientMessage(m).isOk());
  m.device_name.clear();
  EXPECT_TRUE(checkClientMessage(m).isOk());
}

TEST(DeviceNameTest, ControlAndNonAsciiBytesFail) {
  for (const std::string& bad : std::vector<std::string>{std::string("H200\0x", 6), "H200\n",
                                                         "H200\x7f", "H200\x1b[2J", "H200\xff"}) {
    Hello m = validHello();
    m.device_name = bad;
    const Status st = checkClientMessage(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("Hello.device_name"));
    EXPECT_THAT(st.message(), HasSubstr("at 4, not printable ASCII"));
  }
}

TEST(CoresTest, PassesAtTheLimitAndFailsOnePastIt) {
  Hello m = validHello();
  m.cores = kMaxCores;
  EXPECT_TRUE(checkClientMessage(m).isOk());
  m.cores = kMaxCores + 1;
  const Status st = checkClientMessage(m);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("Hello.cores is " + std::to_string(kMaxCores + 1) +
                                      ", limit " + std::to_string(kMaxCores)));
}

TEST(ClientMessageTest, MessagesWithoutBoundedFieldsPass) {
  Chunk chunk;
  chunk.payload = std::string(1 << 20, '\xff');  // bounded by the coordinator, not here
  EXPECT_TRUE(checkClientMessage(chunk).isOk());
  EXPECT_TRUE(checkClientMessage(Summary{}).isOk());
  EXPECT_TRUE(checkClientMessage(UploadRequest{3}).isOk());
  EXPECT_TRUE(checkClientMessage(Heartbeat{9}).isOk());
  EXPECT_TRUE(checkClientMessage(Bye{}).isOk());
  EXPECT_TRUE(checkClientMessage(Error{ErrorCode::kInternal, "", 0}).isOk());
}

TEST(MemoryBytesTest, PassesAtTheLimitAndFailsOnePastIt) {
  Hello m = validHello();
  m.memory_bytes = kMaxMemoryBytes;
  EXPECT_TRUE(checkClientMessage(m).isOk());
  m.memory_bytes = UINT64_MAX;  // -1 in the history's signed column
  const Status st = checkClientMessage(m);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("Hello.memory_bytes is 18446744073709551615, limit "));
}

TEST(RequestedPartitionTest, MinusOneOrAnIndexPassesOthersFail) {
  Hello m = validHello();
  for (int32_t ok : {-1, 0, 7, INT32_MAX}) {
    m.requested_partition = ok;  // an index past the run's partitions is the coordinator's
    EXPECT_TRUE(checkClientMessage(m).isOk()) << ok;
  }
  for (int32_t bad : {-2, INT32_MIN}) {
    m.requested_partition = bad;
    const Status st = checkClientMessage(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr("Hello.requested_partition is " + std::to_string(bad)));
  }
}

TEST(ErrorCodeTest, OnlyTheCodesAClientSendsPass) {
  for (ErrorCode code : {ErrorCode::kRejected, ErrorCode::kInternal}) {
    EXPECT_TRUE(checkClientMessage(Error{code, "why", 3}).isOk());
  }
  for (ErrorCode code : {ErrorCode::kUnknown, ErrorCode::kMalformed, ErrorCode::kUnknownClient,
                         ErrorCode::kStaleTask, ErrorCode::kBadVersion}) {
    const Status st = checkClientMessage(Error{code, "why", 3});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << static_cast<int>(code);
    EXPECT_THAT(st.message(), HasSubstr("is not one a client sends"));
  }
}

TEST(FreeTextTest, TabsNewlinesAndUtf8PassControlCharactersFail) {
  const std::string fine = "step 3:\n\tRuntimeError: caf\xc3\xa9 \xe2\x9c\x93";
  EXPECT_TRUE(checkClientMessage(Bye{fine}).isOk());
  EXPECT_TRUE(checkClientMessage(Error{ErrorCode::kInternal, fine, 0}).isOk());
  for (const std::string& bad : std::vector<std::string>{"oops\x1b[2J", std::string("oops\0", 5),
                                                         "oops\r", "oops\x7f", "oops\x08"}) {
    Status st = checkClientMessage(Bye{bad});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("Bye.reason"));
    EXPECT_THAT(st.message(), HasSubstr("at 4, not text"));
    st = checkClientMessage(Error{ErrorCode::kRejected, bad, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("Error.message"));
  }
}

TEST(ClientMessageTest, CoordinatorMessagesFail) {
  for (const Message& m : {Message(Task{}), Message(Cancel{}), Message(UploadGrant{})}) {
    const Status st = checkClientMessage(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), std::string(messageName(m)) + " is not a message a client sends");
  }
}

}  // namespace
}  // namespace fedfleet::wire

namespace fedfleet::wire {
namespace {

// What a client may send of secure aggregation: its own steps, with entries of the sizes their
// kinds have, and no more of them than kMaxSecAggEntries.
TEST(SecAggLimitsTest, OnlyAClientsOwnStepsOfTheRightSizesPass) {
  SecAgg advert;
  advert.step = SecAggStep::kAdvert;
  advert.adverts.push_back({0, std::string(32, 'a'), std::string(32, 'b'), std::string(32, 'c')});
  EXPECT_TRUE(checkClientMessage(advert).isOk());
  SecAgg short_key = advert;
  short_key.adverts[0].mask_key.pop_back();
  EXPECT_FALSE(checkClientMessage(short_key).isOk());
  SecAgg keys = advert;
  keys.step = SecAggStep::kKeys;  // the coordinator's step
  const Status st = checkClientMessage(keys);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("not one a client sends"), std::string::npos) << st.message();

  SecAgg shares;
  shares.step = SecAggStep::kShares;
  shares.shares.assign(kMaxSecAggEntries, {0, 1, std::string(secagg::kSealedSharesBytes, 's')});
  EXPECT_TRUE(checkClientMessage(shares).isOk());
  shares.shares.push_back(shares.shares[0]);
  EXPECT_FALSE(checkClientMessage(shares).isOk());
  shares.shares.resize(1);
  shares.shares[0].sealed.push_back('x');
  EXPECT_FALSE(checkClientMessage(shares).isOk());

  SecAgg reveal;
  reveal.step = SecAggStep::kReveal;
  reveal.revealed.push_back({1, true, std::string(44, 'r')});
  EXPECT_TRUE(checkClientMessage(reveal).isOk());
  reveal.revealed[0].share.resize(43);
  EXPECT_FALSE(checkClientMessage(reveal).isOk());
}

// Each step carries its own list only; survivors and dropped are the coordinator's, whatever
// the step.
TEST(SecAggLimitsTest, ListsOfAnotherStepOrOfTheCoordinatorFail) {
  SecAgg advert;
  advert.step = SecAggStep::kAdvert;
  advert.adverts.push_back({0, std::string(32, 'a'), std::string(32, 'b'), std::string(32, 'c')});
  SecAgg with_shares = advert;
  with_shares.shares.push_back({0, 1, std::string(secagg::kSealedSharesBytes, 's')});
  EXPECT_THAT(checkClientMessage(with_shares).message(), HasSubstr("a list of another step"));
  SecAgg reveal;
  reveal.step = SecAggStep::kReveal;
  reveal.revealed.push_back({1, true, std::string(44, 'r')});
  SecAgg with_adverts = reveal;
  with_adverts.adverts = advert.adverts;
  EXPECT_THAT(checkClientMessage(with_adverts).message(), HasSubstr("a list of another step"));
  for (bool survivors : {true, false}) {
    SecAgg r = reveal;
    (survivors ? r.request.survivors : r.request.dropped).push_back(2);
    const Status st = checkClientMessage(r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("the coordinator's to send"));
  }
}

}  // namespace
}  // namespace fedfleet::wire
