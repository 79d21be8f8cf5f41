// Small HDF5 helpers shared by the checkpoint writer, reader and tools: a
// handle closed on scope exit, attribute readers that report absence instead
// of printing HDF5's error stack, and attribute writers whose failures name
// the file.
#pragma once

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "util/error.h"

namespace wiola::h5 {

// An HDF5 id closed on scope exit (negative: the call failed).
struct Id {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Id() {
    if (id >= 0 && close) close(id);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  operator hid_t() const { return id; }
  bool ok() const { return id >= 0; }
};

// HDF5 prints its own error stack by default; wiola reports one message.
inline void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

inline void need(bool ok, const std::string& file, const std::string& what) {
  WIOLA_CHECK(ok, file, ": HDF5 failed at ", what, " (disk full or not writable?)");
}

inline bool read_attr_i64(hid_t obj, const char* name, std::vector<int64_t>& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return false;
  Id sp(H5Aget_space(a), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(sp);
  if (n < 0) return false;
  out.resize(size_t(n));
  return H5Aread(a, H5T_NATIVE_INT64, out.data()) >= 0;
}
inline bool read_attr_u64(hid_t obj, const char* name, uint64_t& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return false;
  Id sp(H5Aget_space(a), H5Sclose);
  return H5Sget_simple_extent_npoints(sp) == 1 && H5Aread(a, H5T_NATIVE_UINT64, &out) >= 0;
}
inline bool read_attr_str(hid_t obj, const char* name, std::string& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return false;
  Id t(H5Aget_type(a), H5Tclose);
  if (H5Tget_class(t) != H5T_STRING) return false;
  std::string buf(H5Tget_size(t), '\0');
  if (H5Aread(a, t, buf.data()) < 0) return false;
  out = buf.substr(0, buf.find('\0'));
  return true;
}

inline void attr_i64(const std::string& file, hid_t obj, const char* name, const std::vector<int64_t>& v) {
  const hsize_t n = v.size();
  Id sp(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id a(sp.ok() ? H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT) : -1, H5Aclose);
  need(a.ok() && H5Awrite(a, H5T_NATIVE_INT64, v.data()) >= 0, file, name);
}
inline void attr_u64(const std::string& file, hid_t obj, const char* name, uint64_t v) {
  Id sp(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(sp.ok() ? H5Acreate2(obj, name, H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT) : -1, H5Aclose);
  need(a.ok() && H5Awrite(a, H5T_NATIVE_UINT64, &v) >= 0, file, name);
}
inline void attr_str(const std::string& file, hid_t obj, const char* name, const std::string& v) {
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  need(t.ok() && H5Tset_size(t, std::max<size_t>(1, v.size())) >= 0, file, name);
  Id sp(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(sp.ok() ? H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT) : -1, H5Aclose);
  const std::string padded = v.empty() ? std::string(1, '\0') : v;
  need(a.ok() && H5Awrite(a, t, padded.data()) >= 0, file, name);
}

}  // namespace wiola::h5
