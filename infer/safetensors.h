// The safetensors format (Hugging Face): 8-byte little-endian header length,
// a JSON header {"__metadata__": {...}, NAME: {"dtype", "shape",
// "data_offsets": [begin, end]}} padded with spaces to a multiple of 8, then
// the tensors' bytes back to back in header order (sorted by name, as the
// reference library writes them). Also the sharded layout transformers
// writes above a size limit: model-0000K-of-0000N.safetensors and
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace wiola::st {

enum class DType { F32, BF16, F16 };
const char* dtype_name(DType t);
size_t dtype_size(DType t);

// float -> bfloat16, round to nearest even (NaN stays NaN).
uint16_t to_bf16(float x);
float from_bf16(uint16_t b);
float from_f16(uint16_t h);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

// What a writer is told about each tensor before its data.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Writes one file: `fill(spec, out)` is called once per tensor (in name
// order) to produce its float32 values; they are stored as `dtype`. Written
// to path + ".tmp", fsynced and renamed. Returns the file's size.
uint64_t write_file(const std::string& path, std::vector<TensorSpec> tensors, DType dtype,
                    const std::map<std::string, std::string>& metadata,
                    const std::function<void(const TensorSpec&, std::vector<float>&)>& fill);

// One safetensors file opened for reading; the header is validated strictly
// (JSON, known dtypes, shapes that match their byte ranges, ranges inside
// the file that tile the data section without overlap). Errors name the file
// and the tensor.
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // The tensor's values as float32 (bf16 and f16 widened exactly).
  std::vector<float> read(const std::string& name) const;

 private:
  void read_header();  // validates the header into tensors_ and metadata_

  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_start_ = 0;
  int fd_ = -1;
};

// A model folder: model.safetensors, or model.safetensors.index.json and the
// shards it names. Every tensor name once, across all files.
class Folder {
 public:
  explicit Folder(const std::string& dir);
  ~Folder();
  const std::vector<std::string>& files() const { return files_; }
  std::vector<const TensorInfo*> tensors() const;  // every tensor, by name
  const TensorInfo* find(const std::string& name) const;
  std::vector<float> read(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<File>> open_;
  std::map<std::string, size_t> where_;  // name -> index into open_
};

inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
// "model-00002-of-00005.safetensors"
std::string shard_name(int k, int n);

// "5GB", "500MB", "10KB", "123" (bytes; decimal units as transformers uses).
uint64_t parse_size(const std::string& s);

}  // namespace wiola::st
