// HDF5 shard writer/reader and the bad-file errors.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fstream>
#include <numeric>

#include "data/shard.h"
#include "data_test_util.h"
#include "tests/util/error_of.h"
#include "util/error.h"

namespace wiola {
namespace {

ShardMeta meta(uint32_t vocab, uint64_t n, uint64_t docs = 1) {
  ShardMeta m;
  m.vocab_size = vocab;
  m.eos_id = 2;
  m.tokenizer_sha256 = std::string(64, 'a');
  m.num_tokens = n;
  m.num_documents = docs;
  return m;
}

using test::error_of;

TEST(Shard, WriteReadRoundTripUint16) {
  test::TempDir dir("shard16");
  std::vector<int32_t> tok(100000);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7919) % 32000);
  ShardWriteOptions o;
  o.chunk_tokens = 4096;
  write_shard(dir / "s.h5", tok.data(), tok.size(), meta(32000, tok.size(), 5), o);
  EXPECT_FALSE(std::filesystem::exists(dir / "s.h5.tmp"));
  ShardReader r(dir / "s.h5");
  EXPECT_EQ(r.size(), tok.size());
  EXPECT_EQ(r.meta().num_documents, 5u);
  EXPECT_EQ(r.meta().tokenizer_sha256, std::string(64, 'a'));
  std::vector<int32_t> out(5000);
  r.read(4000, 5000, out.data());  // spans chunks
  EXPECT_TRUE(std::equal(out.begin(), out.end(), tok.begin() + 4000));
  r.read(tok.size() - 10, 10, out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 10, tok.end() - 10));
  EXPECT_THROW(r.read(tok.size() - 5, 10, out.data()), Error);
  // docs/model.md §6 dtype: uint16 for V <= 65536.
  hid_t f = H5Fopen((dir / "s.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  EXPECT_EQ(H5Tget_size(t), 2u);
  hid_t pl = H5Dget_create_plist(d);
  EXPECT_EQ(H5Pget_layout(pl), H5D_CHUNKED);
  EXPECT_EQ(H5Pget_nfilters(pl), 3);  // shuffle + deflate + fletcher32
  H5Pclose(pl);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
}

TEST(Shard, Uint32ForLargeVocab) {
  test::TempDir dir("shard32");
  std::vector<int32_t> tok = {0, 70000, 99999, 2, 5};
  write_shard(dir / "s.h5", tok.data(), tok.size(), meta(100000, tok.size()));
  ShardReader r(dir / "s.h5");
  std::vector<int32_t> out(5);
  r.read(0, 5, out.data());
  EXPECT_EQ(out, tok);
}

TEST(Shard, BadFilesAreClearErrors) {
  test::TempDir dir("shardbad");
  std::vector<int32_t> tok(50000);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 2654435761u) % 32000);
  write_shard(dir / "good.h5", tok.data(), tok.size(), meta(32000, tok.size()));
  std::string good = test::slurp(dir / "good.h5");

  EXPECT_NE(error_of([&] { ShardReader r(dir / "missing.h5"); }).find("missing.h5: no such file"), std::string::npos);
  test::write_text(dir / "text.h5", "hello, not HDF5\n");
  EXPECT_NE(error_of([&] { ShardReader r(dir / "text.h5"); }).find("not an HDF5 file"), std::string::npos);
  test::write_text(dir / "trunc.h5", good.substr(0, good.size() / 2));
  std::string e = error_of([&] { ShardReader r(dir / "trunc.h5"); std::vector<int32_t> o(50000); r.read(0, 50000, o.data()); });
  EXPECT_NE(e.find("trunc.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // Corrupt compressed data in the middle of the file.
  std::string bad = good;
  for (size_t i = bad.size() / 3; i < bad.size() / 3 + 200 && i < bad.size(); ++i) bad[i] = char(0x55);
  test::write_text(dir / "corrupt.h5", bad);
  e = error_of([&] { ShardReader r(dir / "corrupt.h5"); std::vector<int32_t> o(50000); r.read(0, 50000, o.data()); });
  EXPECT_NE(e.find("corrupt.h5"), std::string::npos) << e;

  // Wrong dtype: float32 /tokens, and int64.
  for (hid_t type : {H5T_IEEE_F32LE, H5T_STD_I64LE, H5T_STD_U32LE}) {
    std::string p = dir / "dtype.h5";
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t n = 10;
    hid_t sp = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(f, "tokens", type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t as = H5Screate(H5S_SCALAR);
    uint64_t v[] = {32000, 2, 10, 1};
    const char* names[] = {"vocab_size", "eos_id", "num_tokens", "num_documents"};
    for (int i = 0; i < 4; ++i) {
      hid_t a = H5Acreate2(d, names[i], H5T_STD_U64LE, as, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_UINT64, &v[i]);
      H5Aclose(a);
    }
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 3);
    hid_t a = H5Acreate2(d, "tokenizer_sha256", st, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, st, "abc");
    H5Aclose(a);
    H5Tclose(st);
    H5Sclose(as);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
    e = error_of([&] { ShardReader r(p); });
    EXPECT_NE(e.find("wrong dtype"), std::string::npos) << e;
  }
  // An HDF5 file without /tokens.
  {
    hid_t f = H5Fcreate((dir / "empty.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    e = error_of([&] { ShardReader r(dir / "empty.h5"); });
    EXPECT_NE(e.find("no dataset /tokens"), std::string::npos) << e;
  }
  // Token ids beyond the vocabulary.
  std::vector<int32_t> big = {1, 2, 40000};
  write_shard(dir / "oov.h5", big.data(), big.size(), meta(32000, 3));
  ShardReader r(dir / "oov.h5");
  std::vector<int32_t> o(3);
  e = error_of([&] { r.read(0, 3, o.data()); });
  EXPECT_NE(e.find("oov.h5: token 40000 at position 2 >= vocab_size 32000"), std::string::npos) << e;
}

}  // namespace
}  // namespace wiola
