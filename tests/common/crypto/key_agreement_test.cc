// X25519, HKDF-SHA256 and AES-256-GCM against their published test vectors (RFC 7748 6.1,
// RFC 5869 A.1, the GCM specification's test cases 13 and 14), and the refusals that guard
// secure aggregation against hostile keys and tampered ciphertexts.
#include <gtest/gtest.h>

#include <string>

#include "common/crypto/aes_gcm.h"
#include "common/crypto/hkdf.h"
#include "common/crypto/x25519.h"
#include "tests/common/crypto/hex.h"

namespace fedfleet::crypto {
namespace {

TEST(X25519, Rfc7748DiffieHellmanVector) {
  const std::string alice =
      fromHex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
  const std::string bob =
      fromHex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
  EXPECT_EQ(toHexString(x25519PublicKey(alice)),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  EXPECT_EQ(toHexString(x25519PublicKey(bob)),
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  auto ab = x25519Agree(alice, x25519PublicKey(bob));
  auto ba = x25519Agree(bob, x25519PublicKey(alice));
  ASSERT_TRUE(ab.isOk() && ba.isOk());
  EXPECT_EQ(toHexString(*ab), "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  EXPECT_EQ(*ab, *ba);
}

TEST(X25519, RefusesShortAndLowOrderPeerKeys) {
  const std::string own(32, '\x42');
  EXPECT_EQ(x25519Agree(own, std::string(31, '\x09')).status().code(),
            StatusCode::kInvalidArgument);
  // u = 0 and u = 1 are points of small order: the secret is all zeros, which RFC 7748 says to
  // refuse.
  EXPECT_EQ(x25519Agree(own, std::string(32, '\0')).status().code(), StatusCode::kInvalidArgument);
  std::string one(32, '\0');
  one[0] = 1;
  EXPECT_EQ(x25519Agree(own, one).status().code(), StatusCode::kInvalidArgument);
}

// One imported key, several peers: RFC 7748's secret with Bob, and with each other peer the
// secret both sides compute one agreement at a time; bad peer keys refused after good ones,
// and good ones agreed after a refusal.
TEST(X25519, OneImportedKeyAgreesWithEachPeerAsSingleAgreementsDo) {
  const std::string alice =
      fromHex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
  const std::string bob_public =
      fromHex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  const X25519Agreement agreement(alice);
  auto with_bob = agreement.with(bob_public);
  ASSERT_TRUE(with_bob.isOk());
  EXPECT_EQ(toHexString(*with_bob),
            "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  for (char c : {'\x01', '\x7f', '\xa5'}) {
    const std::string peer(32, c);
    auto ours = agreement.with(x25519PublicKey(peer));
    auto theirs = x25519Agree(peer, x25519PublicKey(alice));
    ASSERT_TRUE(ours.isOk() && theirs.isOk());
    EXPECT_EQ(*ours, *theirs);
    EXPECT_NE(*ours, *with_bob);
  }
  EXPECT_EQ(agreement.with(std::string(31, '\x09')).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agreement.with(std::string(32, '\0')).status().code(), StatusCode::kInvalidArgument);
  auto again = agreement.with(bob_public);
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(*again, *with_bob);
}

TEST(Hkdf, Rfc5869TestCase1) {
  const std::string ikm(22, '\x0b');
  const std::string salt = fromHex("000102030405060708090a0b0c");
  const std::string info = fromHex("f0f1f2f3f4f5f6f7f8f9");
  EXPECT_EQ(toHexString(hkdfSha256(ikm, salt, info, 42)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
}

TEST(AesGcm, SpecificationVectors13And14) {
  const std::string key(32, '\0'), nonce(12, '\0');
  EXPECT_EQ(toHexString(aesGcmSeal(key, nonce, "", "")), "530f8afbc74536b9a963b4f1c4cb738b");
  EXPECT_EQ(toHexString(aesGcmSeal(key, nonce, "", std::string(16, '\0'))),
            "cea7403d4d606b6e074ec5d3baf39d18d0d1c8a799996bf0265b98b5d48ab919");
}

TEST(AesGcm, OpensItsOwnAndRefusesTamperingAndOtherContexts) {
  const std::string key(32, '\x11'), nonce(12, '\x22');
  const std::string sealed = aesGcmSeal(key, nonce, "round 7", "two shares of a secret");
  auto opened = aesGcmOpen(key, nonce, "round 7", sealed);
  ASSERT_TRUE(opened.isOk()) << opened.status().toString();
  EXPECT_EQ(*opened, "two shares of a secret");
  std::string flipped = sealed;
  flipped[3] ^= 1;
  EXPECT_EQ(aesGcmOpen(key, nonce, "round 7", flipped).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(aesGcmOpen(key, nonce, "round 8", sealed).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(aesGcmOpen(std::string(32, '\x12'), nonce, "round 7", sealed).status().code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(aesGcmOpen(key, nonce, "round 7", sealed.substr(0, 10)).status().code(),
            StatusCode::kCorrupt);
}

}  // namespace
}  // namespace fedfleet::crypto
