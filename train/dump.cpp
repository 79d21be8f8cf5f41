#include "train/dump.h"

#include <hdf5.h>

#include <cstdio>
#include <filesystem>

#include "util/error.h"

namespace wiola {
namespace {

// Every HDF5 call is checked; a failure names the file and the object.
struct H5 {
  std::string path;
  hid_t check(hid_t id, const std::string& what) const {
    WIOLA_CHECK(id >= 0, "writing dump '", path, "': HDF5 failed at ", what);
    return id;
  }
  void check(herr_t e, const std::string& what, int) const {
    WIOLA_CHECK(e >= 0, "writing dump '", path, "': HDF5 failed at ", what);
  }
};

void attr_scalar(const H5& h, hid_t obj, const std::string& name, hid_t mem_type, hid_t file_type, const void* value) {
  hid_t sp = h.check(H5Screate(H5S_SCALAR), name);
  hid_t a = h.check(H5Acreate2(obj, name.c_str(), file_type, sp, H5P_DEFAULT, H5P_DEFAULT), name);
  h.check(H5Awrite(a, mem_type, value), name, 0);
  H5Aclose(a);
  H5Sclose(sp);
}

void dataset(const H5& h, hid_t loc, const std::string& name, const std::vector<hsize_t>& dims, hid_t mem_type,
             hid_t file_type, const void* data) {
  hid_t sp = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  h.check(sp, name);
  hid_t ds = h.check(H5Dcreate2(loc, name.c_str(), file_type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
  h.check(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), name, 0);
  H5Dclose(ds);
  H5Sclose(sp);
}

void param_group(const H5& h, hid_t file, const std::string& gname, const ParamLayout& layout,
                 const std::vector<float>& flat) {
  WIOLA_CHECK(flat.size() == layout.total(), "dump group /", gname, ": ", flat.size(), " values for a layout of ",
              layout.total());
  hid_t g = h.check(H5Gcreate2(file, gname.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), gname);
  for (const ParamEntry& e : layout.entries()) {
    std::vector<hsize_t> dims{hsize_t(e.rows)};
    if (e.is_matrix()) dims.push_back(hsize_t(e.cols));
    dataset(h, g, e.name, dims, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, flat.data() + e.offset);
  }
  H5Gclose(g);
}

}  // namespace

void write_step_dump(const std::string& path, const ParamLayout& layout, const StepDump& d) {
  for (const ParamEntry& e : layout.entries())
    WIOLA_CHECK(e.rows == e.grows && e.cols == e.gcols, "numerics dump needs unsharded tensors (", e.name,
                " is sharded)");
  const std::string tmp = path + ".tmp";
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    WIOLA_CHECK(!ec, "numerics dump '", path, "': cannot create directory '", parent.string(), "': ", ec.message());
  }
  H5 h{path};
  hid_t f = h.check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create");
  try {
    const ModelConfig& c = d.cfg;
    hid_t cg = h.check(H5Gcreate2(f, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "/config");
    const std::pair<const char*, int64_t> ints[] = {
        {"d", c.d},    {"L", c.L}, {"H", c.H}, {"H_kv", c.Hkv},      {"d_A", c.dA},
        {"d_B", c.dB}, {"V", c.V}, {"T", c.T}, {"Lambda", c.Lambda}, {"atm", c.atm ? 1 : 0}};
    for (const auto& [k, v] : ints) attr_scalar(h, cg, k, H5T_NATIVE_INT64, H5T_STD_I64LE, &v);
    const std::pair<const char*, double> floats[] = {{"theta0", c.theta0}, {"k_s", c.k_s}, {"a_s", c.a_s},
                                                     {"f_s", c.f_s},       {"tau", c.tau}, {"eps", c.eps}};
    for (const auto& [k, v] : floats) attr_scalar(h, cg, k, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &v);
    for (const auto& [k, v] : d.int_attrs) attr_scalar(h, cg, k, H5T_NATIVE_INT64, H5T_STD_I64LE, &v);
    for (const auto& [k, v] : d.float_attrs) attr_scalar(h, cg, k, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &v);
    H5Gclose(cg);

    WIOLA_CHECK(d.tokens.size() == size_t(d.B) * (c.T + 1), "dump: token batch has wrong size");
    dataset(h, f, "tokens", {hsize_t(d.B), hsize_t(c.T + 1)}, H5T_NATIVE_INT32, H5T_STD_I32LE, d.tokens.data());
    param_group(h, f, "params", layout, d.params);
    param_group(h, f, "grads", layout, d.grads);
    param_group(h, f, "params_after", layout, d.params_after);
    if (!d.m.empty()) {
      hid_t og = h.check(H5Gcreate2(f, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "/optim");
      param_group(h, og, "m", layout, d.m);
      param_group(h, og, "v", layout, d.v);
      H5Gclose(og);
    }
    dataset(h, f, "loss", {}, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &d.loss);
    dataset(h, f, "grad_norm", {}, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &d.grad_norm);
    if (!d.atm.empty()) {
      hid_t ag = h.check(H5Gcreate2(f, "atm", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "/atm");
      for (const auto& [l, open] : d.atm) {
        WIOLA_CHECK(open.size() == size_t(d.B) * c.T, "dump: ATM map of layer ", l, " has wrong size");
        dataset(h, ag, "layer_" + std::to_string(l), {hsize_t(d.B), hsize_t(c.T)}, H5T_NATIVE_UINT8, H5T_STD_U8LE,
                open.data());
      }
      H5Gclose(ag);
    }
    if (!d.doc_start.empty()) {  // documents (docs/model.md §2)
      WIOLA_CHECK(d.doc_start.size() == size_t(d.B) * c.T, "dump: document starts have wrong size");
      dataset(h, f, "doc_start", {hsize_t(d.B), hsize_t(c.T)}, H5T_NATIVE_INT32, H5T_STD_I32LE, d.doc_start.data());
    }
    if (!d.logits.empty()) {
      WIOLA_CHECK(d.logits.size() == size_t(d.B) * c.T * c.V, "dump: logits have wrong size");
      dataset(h, f, "logits", {hsize_t(d.B), hsize_t(c.T), hsize_t(c.V)}, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE,
              d.logits.data());
    }
  } catch (...) {
    H5Fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  h.check(H5Fclose(f), "close", 0);
  std::filesystem::rename(tmp, path);
}

}  // namespace wiola
