// The safetensors reader and writer: round trips in F32 and BF16 (rounding
// to nearest even, NaN, infinities), the sharded folder layout, and a strict
// header: every malformed file is one error naming the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/safetensors.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola::st {
namespace {

std::string dir() {
  const fs::path d = fs::path(WIOLA_BINARY_DIR) / "safetensors_test";
  fs::create_directories(d);
  return d.string();
}

// a [2, 3] and b [4] with values from their names.
uint64_t write_two(const std::string& path, DType t) {
  return write_file(path, {{"b", {4}}, {"a", {2, 3}}}, t, {{"format", "pt"}},
                    [](const TensorSpec& s, std::vector<float>& v) {
                      for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) + (s.name == "a" ? 0.5f : -1.25f);
                    });
}

// A file from a header text and `data` bytes, for the malformed cases.
std::string raw_file(const std::string& name, const std::string& header, size_t data, int64_t len_override = -1) {
  const std::string path = dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t hl = len_override >= 0 ? uint64_t(len_override) : header.size();
  for (int i = 0; i < 8; ++i) f.put(char((hl >> (8 * i)) & 0xFF));
  f << header << std::string(data, '\0');
  return path;
}

void expect_error(const std::string& path, const std::string& needle) {
  try {
    File f(path);
    ADD_FAILURE() << path << ": no error, expected one with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripF32SortedAndPadded) {
  const std::string p = dir() + "/f32.safetensors";
  const uint64_t size = write_two(p, DType::F32);
  EXPECT_EQ(size, fs::file_size(p));
  File f(p);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[0].begin, 0u);  // the data section in name order
  EXPECT_EQ(f.tensors()[1].begin, 24u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.read("a"), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}));
  EXPECT_EQ(f.read("b"), (std::vector<float>{-1.25f, -0.25f, 0.75f, 1.75f}));
  std::ifstream in(p, std::ios::binary);
  uint64_t hl = 0;
  in.read(reinterpret_cast<char*>(&hl), 8);
  EXPECT_EQ(hl % 8, 0u);
  EXPECT_THROW(f.read("c"), Error);
}

TEST(Safetensors, Bf16RoundsToNearestEven) {
  const auto bits = [](float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; };
  const auto from_bits = [](uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; };
  EXPECT_EQ(to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie, even below
  EXPECT_EQ(to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie, odd: up
  EXPECT_EQ(to_bf16(from_bits(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::nanf("")))));
  EXPECT_EQ(to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // float max rounds to infinity, as torch does
  for (float x : {0.0f, -2.0f, 3.140625f, 1e-30f}) EXPECT_EQ(bits(from_bf16(to_bf16(x))) >> 16, to_bf16(x));
  EXPECT_EQ(from_f16(0x3C00), 1.0f);
  EXPECT_EQ(from_f16(0xC000), -2.0f);
  EXPECT_EQ(from_f16(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(from_f16(0x7C00)));

  const std::string p = dir() + "/bf16.safetensors";
  write_two(p, DType::BF16);
  File f(p);
  EXPECT_EQ(f.tensors()[0].dtype, DType::BF16);
  EXPECT_EQ(f.tensors()[0].end, 12u);
  EXPECT_EQ(f.read("b"), (std::vector<float>{-1.25f, -0.25f, 0.75f, 1.75f}));  // exact in bf16
}

TEST(Safetensors, ShardedFolder) {
  const fs::path d = fs::path(dir()) / "sharded";
  fs::remove_all(d);
  fs::create_directories(d);
  write_file((d / shard_name(1, 2)).string(), {{"a", {2, 3}}}, DType::F32, {},
             [](const TensorSpec&, std::vector<float>& v) { v.assign(v.size(), 1.0f); });
  write_file((d / shard_name(2, 2)).string(), {{"b", {4}}}, DType::F32, {},
             [](const TensorSpec&, std::vector<float>& v) { v.assign(v.size(), 2.0f); });
  EXPECT_EQ(shard_name(2, 2), "model-00002-of-00002.safetensors");
  std::ofstream(d / kIndexFile) << nlohmann::json{{"metadata", {{"total_size", 40}}},
                                                  {"weight_map", {{"a", shard_name(1, 2)}, {"b", shard_name(2, 2)}}}};
  Folder f(d.string());
  EXPECT_EQ(f.files().size(), 2u);
  EXPECT_EQ(f.read("b"), std::vector<float>(4, 2.0f));
  EXPECT_EQ(f.tensors().size(), 2u);
  // An index that maps a tensor to a shard without it is refused.
  std::ofstream(d / kIndexFile) << nlohmann::json{{"weight_map", {{"a", shard_name(2, 2)}, {"b", shard_name(2, 2)}}}};
  EXPECT_THROW(Folder{d.string()}, Error);
  EXPECT_THROW(Folder{dir() + "/nothing-here"}, Error);
}

TEST(Safetensors, MalformedFilesAreOneClearError) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(File(raw_file("ok.safetensors", ok, 8)));
  expect_error(raw_file("short.safetensors", "", 0, 0).substr(0), "header length");
  expect_error(raw_file("trunc.safetensors", ok, 4), "outside the data section");
  expect_error(raw_file("long.safetensors", ok, 8, 1 << 20), "does not fit the file");
  expect_error(raw_file("json.safetensors", "{nope", 0), "not JSON");
  expect_error(raw_file("dtype.safetensors", R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8),
               "dtype I64 is not supported");
  expect_error(raw_file("size.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               "8 bytes for 3");
  expect_error(raw_file("overlap.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8),
               "overlaps");
  expect_error(raw_file("gap.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "a gap");
  expect_error(raw_file("tail.safetensors", ok, 12), "after the last tensor");
  expect_error(raw_file("fields.safetensors", R"({"a":{"dtype":"F32"}})", 0), "needs dtype, shape and data_offsets");
  // Found by fuzzing: a shape whose element count overflows int64, and
  // numbers that are not integers of the field's range.
  expect_error(raw_file("huge.safetensors",
                        R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
               "shape holds more values than the file has bytes");
  expect_error(raw_file("float.safetensors", R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
               "tensor a: shape[0] is 1.5, not an integer");
  expect_error(raw_file("neg.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
               "tensor a: data_offsets[0] is -4, not an integer from 0 to 18446744073709551615");
  EXPECT_THROW(File(dir() + "/missing.safetensors"), Error);
}

TEST(Safetensors, SizesLikeTransformers) {
  EXPECT_EQ(parse_size("5GB"), 5000000000u);
  EXPECT_EQ(parse_size("200MB"), 200000000u);
  EXPECT_EQ(parse_size("10kb"), 10000u);
  EXPECT_EQ(parse_size("2MiB"), 2097152u);
  EXPECT_EQ(parse_size("1234"), 1234u);
  EXPECT_THROW(parse_size("lots"), Error);
  EXPECT_THROW(parse_size("5XB"), Error);
  EXPECT_THROW(parse_size("0"), Error);
  EXPECT_EQ(parse_size("1.5KB"), 1500u);
  EXPECT_THROW(parse_size("."), Error);  // was std::invalid_argument from stod
  EXPECT_THROW(parse_size("1.2.3MB"), Error);
  EXPECT_THROW(parse_size("99999999999999999999999GB"), Error);  // was an out-of-range float-to-int cast
}

TEST(Safetensors, IndexMapsToFilesOfTheFolderOnly) {
  const std::string d = dir() + "/index-paths";
  fs::create_directories(d);
  for (const std::string bad : {R"("../model.safetensors")", R"("/etc/passwd")", "3", R"("")"}) {
    std::ofstream(d + "/" + kIndexFile) << R"({"weight_map": {"a": )" << bad << "}}";
    try {
      Folder f(d);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a file name of the folder"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace wiola::st
