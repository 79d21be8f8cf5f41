#include "data/shard.h"

#include <hdf5.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "util/error.h"

namespace wiola {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  static bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
  return m;
}

namespace {
constexpr const char* kFormat = "wiola-tokens-1";

// Closes an HDF5 handle of any kind on scope exit.
struct H5Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5Handle() {
    if (id >= 0 && close) close(id);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
};

void write_attr_u64(hid_t obj, const char* name, uint64_t v, const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, H5T_STD_U64LE, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.id < 0 || H5Awrite(a.id, H5T_NATIVE_UINT64, &v) < 0) fail(path, ": cannot write attribute ", name);
}

void write_attr_str(hid_t obj, const char* name, const std::string& v, const std::string& path) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id, std::max<size_t>(v.size(), 1));
  H5Tset_strpad(type.id, H5T_STR_NULLPAD);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string buf = v.empty() ? std::string(1, '\0') : v;
  if (a.id < 0 || H5Awrite(a.id, type.id, buf.data()) < 0) fail(path, ": cannot write attribute ", name);
}

uint64_t read_attr_u64(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) fail(path, ": not a wiola token shard (attribute '", name, "' missing)");
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Handle t(H5Aget_type(a.id), H5Tclose);
  if (H5Tget_class(t.id) != H5T_INTEGER) fail(path, ": attribute '", name, "' is not an integer");
  uint64_t v = 0;
  if (H5Aread(a.id, H5T_NATIVE_UINT64, &v) < 0) fail(path, ": cannot read attribute '", name, "'");
  return v;
}

std::string read_attr_str(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) fail(path, ": not a wiola token shard (attribute '", name, "' missing)");
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Handle t(H5Aget_type(a.id), H5Tclose);
  if (H5Tget_class(t.id) != H5T_STRING) fail(path, ": attribute '", name, "' is not a string");
  if (H5Tis_variable_str(t.id) > 0) {  // e.g. written by h5py
    H5Handle mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt.id, H5T_VARIABLE);
    char* s = nullptr;
    if (H5Aread(a.id, mt.id, &s) < 0) fail(path, ": cannot read attribute '", name, "'");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(t.id);
  std::string buf(n, '\0');
  if (H5Aread(a.id, t.id, buf.data()) < 0) fail(path, ": cannot read attribute '", name, "'");
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}
}  // namespace

void write_shard(const std::string& path, const int32_t* tokens, uint64_t n, const ShardMeta& meta,
                 const ShardWriteOptions& opt) {
  WIOLA_CHECK(meta.num_tokens == n, path, ": shard meta says ", meta.num_tokens, " tokens, writing ", n);
  WIOLA_CHECK(n > 0, path, ": refusing to write an empty shard");
  const bool u16 = meta.vocab_size <= 65536;
  std::string tmp = path + ".tmp";
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (file.id < 0) fail(path, ": cannot create HDF5 file ", tmp);
    hsize_t dims[1] = {n};
    hsize_t chunk[1] = {std::min<hsize_t>(std::max<uint64_t>(opt.chunk_tokens, 1), n)};
    H5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl.id, 1, chunk);
    H5Pset_shuffle(dcpl.id);
    if (opt.deflate_level > 0) H5Pset_deflate(dcpl.id, unsigned(opt.deflate_level));
    H5Pset_fletcher32(dcpl.id);  // per-chunk checksum: corrupt data fails the read
    H5Pset_obj_track_times(dcpl.id, false);  // no timestamps: the same tokens, the same bytes
    H5Handle dset(H5Dcreate2(file.id, "tokens", u16 ? H5T_STD_U16LE : H5T_STD_U32LE, space.id, H5P_DEFAULT,
                             dcpl.id, H5P_DEFAULT),
                  H5Dclose);
    if (dset.id < 0) fail(path, ": cannot create dataset /tokens");
    if (H5Dwrite(dset.id, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) < 0) {
      std::remove(tmp.c_str());
      fail(path, ": writing /tokens failed (disk full?)");
    }
    write_attr_str(dset.id, "format", kFormat, path);
    for (hid_t obj : {file.id, dset.id}) {  // on the file and on the dataset
      write_attr_u64(obj, "vocab_size", meta.vocab_size, path);
      write_attr_u64(obj, "eos_id", meta.eos_id, path);
      write_attr_str(obj, "tokenizer_sha256", meta.tokenizer_sha256, path);
      write_attr_u64(obj, "num_tokens", meta.num_tokens, path);
      write_attr_u64(obj, "num_documents", meta.num_documents, path);
    }
    if (H5Fflush(file.id, H5F_SCOPE_GLOBAL) < 0) {
      std::remove(tmp.c_str());
      fail(path, ": flushing failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    fail(path, ": cannot rename ", tmp, " into place: ", std::strerror(e));
  }
}

ShardReader::ShardReader(const std::string& path, size_t chunk_cache_bytes) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, ": no such file");
  if (std::filesystem::is_directory(path, ec)) fail(path, ": is a directory, expected an HDF5 shard");
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    fail(path, ": cannot open: ", std::strerror(errno));
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (H5Fis_hdf5(path.c_str()) <= 0) fail(path, ": not an HDF5 file");
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) fail(path, ": cannot open as HDF5 (corrupt or truncated file)");
  file_ = file;
  try {
    if (H5Lexists(file, "tokens", H5P_DEFAULT) <= 0) fail(path, ": no dataset /tokens (not a wiola token shard)");
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    H5Pset_chunk_cache(dapl, 521, chunk_cache_bytes, 0.75);
    hid_t d = H5Dopen2(file, "tokens", dapl);
    H5Pclose(dapl);
    if (d < 0) fail(path, ": cannot open dataset /tokens (corrupt file?)");
    dset_ = d;
    H5Handle space(H5Dget_space(d), H5Sclose);
    if (H5Sget_simple_extent_ndims(space.id) != 1) fail(path, ": /tokens is not 1-D");
    hsize_t dims[1] = {0};
    H5Sget_simple_extent_dims(space.id, dims, nullptr);
    H5Handle type(H5Dget_type(d), H5Tclose);
    bool is_int = H5Tget_class(type.id) == H5T_INTEGER;
    bool is_unsigned = is_int && H5Tget_sign(type.id) == H5T_SGN_NONE;
    size_t bytes = H5Tget_size(type.id);
    meta_.vocab_size = uint32_t(read_attr_u64(d, "vocab_size", path));
    meta_.eos_id = uint32_t(read_attr_u64(d, "eos_id", path));
    meta_.tokenizer_sha256 = read_attr_str(d, "tokenizer_sha256", path);
    meta_.num_tokens = read_attr_u64(d, "num_tokens", path);
    meta_.num_documents = read_attr_u64(d, "num_documents", path);
    size_t want = meta_.vocab_size <= 65536 ? 2 : 4;
    if (!is_int || !is_unsigned || bytes != want)
      fail(path, ": /tokens has the wrong dtype (", is_int ? (is_unsigned ? "uint" : "int") : "non-integer ",
           bytes * 8, "); docs/model.md §6 wants uint", want * 8, " for vocab_size ", meta_.vocab_size);
    if (meta_.num_tokens != dims[0])
      fail(path, ": attribute num_tokens = ", meta_.num_tokens, " but /tokens holds ", dims[0]);
    if (meta_.eos_id >= meta_.vocab_size) fail(path, ": eos_id ", meta_.eos_id, " >= vocab_size ", meta_.vocab_size);
  } catch (...) {
    if (dset_ >= 0) H5Dclose(hid_t(dset_));
    H5Fclose(file);
    throw;
  }
}

ShardReader::~ShardReader() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (dset_ >= 0) H5Dclose(hid_t(dset_));
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

void ShardReader::read(uint64_t start, uint64_t count, int32_t* out) const {
  if (count == 0) return;
  WIOLA_CHECK(start + count <= meta_.num_tokens, path_, ": read of tokens [", start, ", ", start + count,
              ") past the end (", meta_.num_tokens, ")");
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Handle fspace(H5Dget_space(hid_t(dset_)), H5Sclose);
    hsize_t off[1] = {start}, cnt[1] = {count};
    H5Sselect_hyperslab(fspace.id, H5S_SELECT_SET, off, nullptr, cnt, nullptr);
    H5Handle mspace(H5Screate_simple(1, cnt, nullptr), H5Sclose);
    if (H5Dread(hid_t(dset_), H5T_NATIVE_INT32, mspace.id, fspace.id, H5P_DEFAULT, out) < 0)
      fail(path_, ": reading tokens [", start, ", ", start + count, ") failed (corrupt or truncated file)");
  }
  const uint32_t v = meta_.vocab_size;
  for (uint64_t i = 0; i < count; ++i)
    if (uint32_t(out[i]) >= v) fail(path_, ": token ", out[i], " at position ", start + i, " >= vocab_size ", v);
}

}  // namespace wiola
