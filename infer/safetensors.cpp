#include "infer/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kernels/dtype.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace wiola::st {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

uint16_t to_bf16(float x) { return bf16_round(x); }

float from_bf16(uint16_t b) { return bf16_widen(b); }

float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v;
  if (e == 0) v = std::ldexp(float(m), -24);                       // zero, subnormal
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(float(m | 0x400), int(e) - 25);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u |= sign;
  std::memcpy(&v, &u, 4);
  return v;
}

std::string shard_name(int k, int n) {
  char b[64];
  std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", k, n);
  return b;
}

uint64_t parse_size(const std::string& s) {
  size_t i = 0, dots = 0, digits = 0;
  for (; i < s.size() && (std::isdigit(uint8_t(s[i])) || s[i] == '.'); ++i) (s[i] == '.' ? dots : digits) += 1;
  WIOLA_CHECK(digits > 0 && dots <= 1, "size '", s, "': expected a number with an optional unit (KB, MB, GB)");
  const double v = std::strtod(s.substr(0, i).c_str(), nullptr);
  std::string unit = s.substr(i);
  for (char& c : unit) c = char(std::toupper(uint8_t(c)));
  double mult = 1;
  if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else WIOLA_CHECK(unit.empty() || unit == "B", "size '", s, "': unknown unit '", unit, "' (B, KB, MB, GB, KiB, MiB, GiB)");
  WIOLA_CHECK(v * mult >= 1, "size '", s, "' must be at least one byte");
  WIOLA_CHECK(v * mult <= 0x1p62, "size '", s, "' is too large");
  return uint64_t(v * mult);
}

// ---- writing ----------------------------------------------------------------------
uint64_t write_file(const std::string& path, std::vector<TensorSpec> tensors, DType dtype,
                    const std::map<std::string, std::string>& metadata,
                    const std::function<void(const TensorSpec&, std::vector<float>&)>& fill) {
  WIOLA_CHECK(dtype != DType::F16, path, ": writing F16 is not supported");
  std::sort(tensors.begin(), tensors.end(), [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const TensorSpec& t : tensors) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    const uint64_t bytes = uint64_t(n) * dtype_size(dtype);
    h[t.name] = {{"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  WIOLA_CHECK(f, tmp, ": cannot be written");
  const uint64_t hl = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((hl >> (8 * i)) & 0xFF);
  f.write(len, 8);
  f.write(text.data(), std::streamsize(text.size()));
  std::vector<float> vals;
  std::vector<uint16_t> half;
  for (const TensorSpec& t : tensors) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    vals.assign(size_t(n), 0.0f);
    fill(t, vals);
    WIOLA_CHECK(int64_t(vals.size()) == n, path, ": ", t.name, ": ", vals.size(), " values for ", n, " elements");
    if (dtype == DType::F32) {
      f.write(reinterpret_cast<const char*>(vals.data()), std::streamsize(vals.size() * 4));
    } else {
      half.resize(vals.size());
      std::transform(vals.begin(), vals.end(), half.begin(), to_bf16);
      f.write(reinterpret_cast<const char*>(half.data()), std::streamsize(half.size() * 2));
    }
  }
  f.flush();
  WIOLA_CHECK(f.good(), tmp, ": write failed (disk full?)");
  f.close();
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  WIOLA_CHECK(!ec, path, ": cannot rename into place: ", ec.message());
  return 8 + hl + off;
}

// ---- reading ----------------------------------------------------------------------
namespace {
DType parse_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  fail(where, ": dtype ", s, " is not supported (F32, BF16, F16)");
}

void pread_all(int fd, void* buf, size_t n, uint64_t off, const std::string& path) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(off));
    WIOLA_CHECK(r > 0, path, ": read failed at byte ", off, r < 0 ? std::string(": ") + std::strerror(errno) : " (truncated)");
    p += r;
    n -= size_t(r);
    off += uint64_t(r);
  }
}
}  // namespace

File::File(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY);
  WIOLA_CHECK(fd_ >= 0, path, ": cannot be opened: ", std::strerror(errno));
  try {
    read_header();
  } catch (...) {  // a constructor that throws runs no destructor
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void File::read_header() {
  const std::string& path = path_;
  struct stat sb{};
  ::fstat(fd_, &sb);
  const uint64_t size = uint64_t(sb.st_size);
  WIOLA_CHECK(size >= 8, path, ": ", size, " bytes, too short for a safetensors file");
  unsigned char len[8];
  pread_all(fd_, len, 8, 0, path);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = hl << 8 | len[i];
  WIOLA_CHECK(hl >= 2 && hl <= size - 8 && hl <= (uint64_t(100) << 20), path, ": header length ", hl,
              " does not fit the file (", size, " bytes): not a safetensors file, or truncated");
  std::string text(hl, '\0');
  pread_all(fd_, text.data(), hl, 8, path);
  data_start_ = 8 + hl;
  json h;
  try {
    h = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": header is not JSON (", e.what(), ")");
  }
  WIOLA_CHECK(h.is_object(), path, ": header is not a JSON object");
  const uint64_t data_size = size - data_start_;
  for (auto& [name, v] : h.items()) {
    const std::string where = path + ": tensor " + name;
    if (name == "__metadata__") {
      WIOLA_CHECK(v.is_object(), path, ": __metadata__ is not an object");
      for (auto& [k, x] : v.items()) {
        WIOLA_CHECK(x.is_string(), path, ": __metadata__ value of ", k, " is not a string");
        metadata_[k] = x.get<std::string>();
      }
      continue;
    }
    WIOLA_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), where,
                ": needs dtype, shape and data_offsets");
    TensorInfo t;
    t.name = name;
    try {
      t.dtype = parse_dtype(v["dtype"].get<std::string>(), where);
      t.shape = json_ints<int64_t>(v["shape"], where + ": shape");
      const auto o = json_ints<uint64_t>(v["data_offsets"], where + ": data_offsets");
      WIOLA_CHECK(o.size() == 2, where, ": data_offsets must be [begin, end]");
      t.begin = o[0];
      t.end = o[1];
    } catch (const json::exception& e) {
      fail(where, ": malformed entry (", e.what(), ")");
    }
    // Each dimension bounded by what the data section could hold, so that
    // numel() cannot overflow (a zero dimension makes the tensor empty).
    const bool empty = std::find(t.shape.begin(), t.shape.end(), int64_t(0)) != t.shape.end();
    uint64_t n = 1;
    for (int64_t s : t.shape) {
      WIOLA_CHECK(s >= 0, where, ": negative dimension");
      WIOLA_CHECK(empty || uint64_t(s) <= data_size / n, where, ": shape holds more values than the file has bytes");
      if (!empty) n *= uint64_t(s);
    }
    WIOLA_CHECK(t.begin <= t.end && t.end <= data_size, where, ": bytes [", t.begin, ", ", t.end,
                ") outside the data section (", data_size, " bytes; truncated file?)");
    WIOLA_CHECK(t.end - t.begin == uint64_t(t.numel()) * dtype_size(t.dtype), where, ": ", t.end - t.begin,
                " bytes for ", t.numel(), " ", dtype_name(t.dtype), " values");
    tensors_.push_back(std::move(t));
  }
  // The byte ranges tile the data section: no overlap, no gap.
  std::vector<const TensorInfo*> by_off;
  for (const TensorInfo& t : tensors_) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  uint64_t at = 0;
  for (const TensorInfo* t : by_off) {
    WIOLA_CHECK(t->begin == at, path, ": tensor ", t->name, " starts at byte ", t->begin, " of the data, expected ", at,
                t->begin < at ? " (overlaps the previous tensor)" : " (a gap)");
    at = t->end;
  }
  WIOLA_CHECK(at == data_size, path, ": ", data_size - at, " bytes after the last tensor");
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::vector<float> File::read(const std::string& name) const {
  const TensorInfo* t = find(name);
  WIOLA_CHECK(t, path_, ": no tensor ", name);
  std::vector<float> out(size_t(t->numel()));
  if (t->dtype == DType::F32) {
    pread_all(fd_, out.data(), out.size() * 4, data_start_ + t->begin, path_);
    return out;
  }
  std::vector<uint16_t> h(out.size());
  pread_all(fd_, h.data(), h.size() * 2, data_start_ + t->begin, path_);
  std::transform(h.begin(), h.end(), out.begin(), t->dtype == DType::BF16 ? from_bf16 : from_f16);
  return out;
}

Folder::Folder(const std::string& dir) : dir_(dir) {
  const fs::path single = fs::path(dir) / kSingleFile, index = fs::path(dir) / kIndexFile;
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail(index.string(), ": not JSON (", e.what(), ")");
    }
    WIOLA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
                ": no weight_map");
    std::map<std::string, std::string> map;
    for (auto& [name, f] : j["weight_map"].items()) {
      // Shards are files of this folder: a plain name, no path.
      WIOLA_CHECK(f.is_string() && is_plain_file_name(f.get<std::string>()), index.string(), ": weight_map maps ", name,
                  " to ", f.dump(), ", not a file name of the folder");
      map[name] = f.get<std::string>();
    }
    for (auto& [name, f] : map)
      if (std::find(files_.begin(), files_.end(), f) == files_.end()) files_.push_back(f);
    std::sort(files_.begin(), files_.end());
    for (const auto& f : files_) open_.push_back(std::make_unique<File>((fs::path(dir) / f).string()));
    for (auto& [name, f] : map) {
      const size_t k = size_t(std::find(files_.begin(), files_.end(), f) - files_.begin());
      WIOLA_CHECK(open_[k]->find(name), index.string(), ": maps ", name, " to ", f, ", which does not hold it");
      where_[name] = k;
    }
    for (size_t k = 0; k < open_.size(); ++k)
      for (const TensorInfo& t : open_[k]->tensors())
        WIOLA_CHECK(where_.count(t.name) && where_[t.name] == k, open_[k]->path(), ": holds ", t.name,
                    ", which the index does not map to it");
  } else {
    WIOLA_CHECK(fs::exists(single), dir, ": neither ", kSingleFile, " nor ", kIndexFile);
    files_.push_back(kSingleFile);
    open_.push_back(std::make_unique<File>(single.string()));
    for (const TensorInfo& t : open_[0]->tensors()) where_[t.name] = 0;
  }
}

Folder::~Folder() = default;

std::vector<const TensorInfo*> Folder::tensors() const {
  std::vector<const TensorInfo*> out;
  for (auto& [name, k] : where_) out.push_back(open_[k]->find(name));
  return out;
}

const TensorInfo* Folder::find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : open_[it->second]->find(name);
}

std::vector<float> Folder::read(const std::string& name) const {
  auto it = where_.find(name);
  WIOLA_CHECK(it != where_.end(), dir_, ": no tensor ", name);
  return open_[it->second]->read(name);
}

}  // namespace wiola::st
