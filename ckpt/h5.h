// Small HDF5 helpers shared by the checkpoint writer, reader and tools: a
// handle closed on scope exit, a file built in memory (so that no disk
// error ever reaches HDF5), attribute readers that report absence instead of
// printing HDF5's error stack, and attribute writers whose failures name
// the file.
#pragma once

#include <hdf5.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// An HDF5 file built in memory (the core driver, no backing store), closed
// on scope exit. With HDF5 1.10 a write that fails inside HDF5 (a full disk
// at a flush or close) leaves the file half torn down in HDF5's tables: it
// can be neither used nor closed, and HDF5's exit handler crashes on it
// after the error was reported. In memory nothing fails that way; the
// caller writes bytes() to disk itself, where every error is its own to
// report. The memory it takes is about the file's size, and bytes() copies
// it once more.
class MemoryFile {
 public:
  // `size_hint`: about the size the file will have (memory grows in steps of it).
  explicit MemoryFile(size_t size_hint) {
    static std::atomic<unsigned> count{0};
    const std::string name = "wiola-memory-file-" + std::to_string(count++);  // open files need distinct names
    Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (fapl.ok() && H5Pset_fapl_core(fapl, std::max<size_t>(size_hint, size_t(1) << 20), 0) >= 0)
      id_ = H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  }
  ~MemoryFile() {
    if (id_ >= 0) H5Fclose(id_);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // The file's bytes, flushed (all that was written so far); empty when
  // HDF5 failed.
  std::vector<char> bytes() const {
    const ssize_t n = H5Fflush(id_, H5F_SCOPE_GLOBAL) >= 0 ? H5Fget_file_image(id_, nullptr, 0) : -1;
    std::vector<char> out(n > 0 ? size_t(n) : 0);
    if (n <= 0 || H5Fget_file_image(id_, out.data(), out.size()) != n) out.clear();
    return out;
  }

 private:
  hid_t id_ = -1;
};

// HDF5 prints its own error stack by default; wiola reports one message.
inline void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// The errno a failed read or write of HDF5's file driver recorded in the
// current error stack ("... errno = 28, error message = ..."), 0 if none.
inline int last_errno() {
  int found = 0;
  auto visit = [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
    const char* at = e->desc ? std::strstr(e->desc, "errno = ") : nullptr;
    if (at && *static_cast<int*>(out) == 0) *static_cast<int*>(out) = std::atoi(at + 8);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, visit, &found);
  return found;
}

// The descriptor of file `f` where it is open on disk with the default
// sec2 driver, else -1.
inline int sec2_fd(hid_t f) {
  Id fapl(H5Fget_access_plist(f), H5Pclose);
  void* handle = nullptr;
  if (!fapl.ok() || H5Pget_driver(fapl) != H5FD_SEC2 || H5Fget_vfd_handle(f, fapl, &handle) < 0 || !handle)
    return -1;
  return *static_cast<int*>(handle);
}

// After a disk error on file `f` (open on disk with the default sec2
// driver): its descriptor now points at an anonymous file in memory, so
// that what HDF5 still writes (the metadata it flushes when the handles
// close) succeeds and goes nowhere. With HDF5 1.10 a file whose flush fails
// at close stays half torn down in HDF5's tables and crashes the process in
// HDF5's exit handlers; this lets every handle close cleanly instead. The
// file on disk is incomplete afterwards: the caller removes it. Returns
// false where it could not (another driver; no memfd).
inline bool discard_writes(hid_t f) {
  const int fd = sec2_fd(f);
  if (fd < 0) return false;
  const int mem = memfd_create("wiola-discarded-hdf5", MFD_CLOEXEC);
  if (mem < 0) return false;
  const bool ok = dup2(mem, fd) == fd;
  close(mem);
  return ok;
}

// Reserves the disk space of all that file `f` (sec2) has allocated so far,
// its end of allocation, without changing its size: the metadata HDF5 holds
// lives there, so flushing it cannot then fail for want of space. A flush
// that fails inside HDF5 leaves its metadata cache in a state no later call
// repairs (discard_writes comes too late then), so call this first and, when
// it fails, discard_writes instead of flushing. Returns the errno (ENOSPC:
// the disk is full), 0 when reserved or where the file system cannot reserve.
inline int reserve_allocated(hid_t f) {
  haddr_t eoa = 0;
  const int fd = sec2_fd(f);
  if (fd < 0 || H5Fget_eoa(f, &eoa) < 0 || eoa == 0) return 0;
  int rc;
  do rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, off_t(eoa));
  while (rc != 0 && errno == EINTR);
  return rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS ? 0 : errno;
}

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
