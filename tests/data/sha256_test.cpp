// SHA-256 (data/sha256.h, OpenSSL underneath): the FIPS 180-4 example vectors,
// streaming in pieces equal to one update, files, and errors.
#include "data/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "data_test_util.h"
#include "util/error.h"

namespace wiola {
namespace {

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PiecesEqualOneUpdate) {
  std::mt19937 rng(7);
  std::string bytes(5000, '\0');
  for (char& c : bytes) c = char(rng() & 0xFF);
  const std::string whole = sha256_hex(bytes);
  // Pieces that cross the 64-byte block boundary in every way, empty ones included.
  for (size_t step : {size_t(1), size_t(7), size_t(63), size_t(64), size_t(65), size_t(1000)}) {
    Sha256 s;
    for (size_t at = 0; at < bytes.size(); at += step) {
      s.update(bytes.data() + at, std::min(step, bytes.size() - at));
      s.update(bytes.data(), 0);
    }
    EXPECT_EQ(s.hex_digest(), whole) << "pieces of " << step;
  }
  Sha256 a;
  a.update("a", 1);
  a.update("bc", 2);
  EXPECT_EQ(a.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, SpentObjectIsAnError) {
  Sha256 s;
  s.update("abc", 3);
  s.hex_digest();
  EXPECT_THROW(s.hex_digest(), Error);
  EXPECT_THROW(s.update("x", 1), Error);
}

TEST(Sha256, Files) {
  test::TempDir dir("sha256");
  test::write_text(dir / "abc.txt", "abc");
  EXPECT_EQ(sha256_file(dir / "abc.txt"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  test::write_text(dir / "empty.txt", "");
  EXPECT_EQ(sha256_file(dir / "empty.txt"), sha256_hex(""));
  // Larger than the 1 MiB read buffer: several updates.
  const std::string big(3 * (1 << 20) + 17, 'q');
  test::write_text(dir / "big.bin", big);
  EXPECT_EQ(sha256_file(dir / "big.bin"), sha256_hex(big));
  // The shipped tokenizer: the digest its manifests pin (tokenizer_test.cpp).
  EXPECT_EQ(sha256_file(test::kWiolaTokenizer), "6143f34c12731e3dfdfb6b803666be63a0a317ce81e7896d29ad75416b83e00e");
  try {
    sha256_file(dir / "missing.txt");
    FAIL() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt: cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wiola
