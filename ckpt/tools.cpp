#include "ckpt/tools.h"

#include <hdf5.h>
#include <xxhash.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "ckpt/h5.h"
#include "config/run_config.h"
#include "model/params.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola::ckpt {
namespace {

using H5Id = h5::Id;
using h5::attr_str;
void quiet_hdf5() { h5::quiet(); }
void attr_i64(const std::string& file, hid_t obj, const char* name, int64_t v) { h5::attr_i64(file, obj, name, {v}); }

// Names of a group's links, in index order (version-neutral: 1.10 and 1.12+
// differ in H5Literate's callback).
std::vector<std::string> children(hid_t group) {
  std::vector<std::string> out;
  H5G_info_t info{};
  if (H5Gget_info(group, &info) < 0) return out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) continue;
    std::string s(size_t(n) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT);
    s.resize(size_t(n));
    out.push_back(std::move(s));
  }
  return out;
}

// One slice as the manifest lists it.
struct Listed {
  int file = 0, k = 0;  // file index, dataset number
  int64_t r0 = 0, c0 = 0, nr = 0, nc = 0;
};

std::string where_of(const nlohmann::json& files, const Listed& s, const std::string& kind, const std::string& name) {
  return files[size_t(s.file)].value("name", std::string("?")) + "/" + kind + "/" + name + "/" + std::to_string(s.k);
}

// How often the slices (all inside a rows x cols tensor) store its
// elements: how many are stored at least once and at least twice, and the
// first (row-major index) stored never and twice. Swept band by band between
// the slices' row edges, so the cost grows with the slices, not the elements.
struct Coverage {
  int64_t covered = 0, doubled = 0;
  int64_t first_hole = -1, first_doubled = -1;
};

Coverage sweep_coverage(const std::vector<Listed>& slices, int64_t rows, int64_t cols) {
  std::vector<int64_t> edges{0, rows};
  for (const Listed& s : slices) {
    edges.push_back(s.r0);
    edges.push_back(s.r0 + s.nr);
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  Coverage cv;
  std::vector<std::pair<int64_t, int>> events;  // (column, +1 a slice starts / -1 ends)
  for (size_t b = 0; b + 1 < edges.size(); ++b) {
    const int64_t r = edges[b], height = edges[b + 1] - r;  // every row of the band is covered alike
    events.assign(1, {cols, 0});
    for (const Listed& s : slices)
      if (s.r0 <= r && r < s.r0 + s.nr) {
        events.push_back({s.c0, +1});
        events.push_back({s.c0 + s.nc, -1});
      }
    std::sort(events.begin(), events.end());
    int depth = 0;
    int64_t at = 0, once = 0, twice = 0;
    for (size_t i = 0; i < events.size();) {
      const int64_t c = events[i].first;
      if (c > at) {  // columns [at, c) are stored `depth` times
        if (depth >= 1) once += c - at;
        if (depth == 0 && cv.first_hole < 0) cv.first_hole = r * cols + at;
        if (depth >= 2) {
          twice += c - at;
          if (cv.first_doubled < 0) cv.first_doubled = r * cols + at;
        }
      }
      at = c;
      for (; i < events.size() && events[i].first == c; ++i) depth += events[i].second;
    }
    cv.covered += once * height;
    cv.doubled += twice * height;
  }
  return cv;
}

// Coverage of every kind of every tensor from the manifest's own lists,
// independent of the Reader (which stops at the first problem): each element
// must be in exactly one slice. Tolerates a malformed manifest (the Reader
// reports that).
void check_coverage(const nlohmann::json& mf, std::vector<std::string>& problems, VerifyStats& st) {
  if (!mf.is_object() || !mf.contains("tensors") || !mf["tensors"].is_object() || !mf.contains("files") ||
      !mf["files"].is_array())
    return;
  std::vector<std::string> kinds;
  try {
    kinds = stored_kinds(mf, "manifest.json");
  } catch (const Error&) {
    return;  // the Reader names a malformed "kinds"
  }
  const nlohmann::json& files = mf["files"];
  std::map<std::pair<std::string, std::string>, std::vector<Listed>> by_tensor;  // (name, kind)
  for (size_t i = 0; i < files.size(); ++i) {
    const nlohmann::json& f = files[i];
    if (!f.is_object() || !f.contains("slices") || !f["slices"].is_object()) continue;
    const std::string fname = f.value("name", std::string("?"));
    for (const auto& [kind, by_name] : f["slices"].items()) {
      if (!by_name.is_object()) continue;
      for (const auto& [name, arr] : by_name.items()) {
        if (!mf["tensors"].contains(name)) {
          problems.push_back(fname + ": holds " + kind + "/" + name + ", not a tensor of the manifest");
          continue;
        }
        if (!arr.is_array()) continue;
        for (size_t k = 0; k < arr.size(); ++k) {
          const nlohmann::json& s = arr[k];
          if (!s.is_array() || s.size() != 4 ||
              !std::all_of(s.begin(), s.end(), [](const nlohmann::json& v) { return v.is_number_integer(); }))
            continue;
          by_tensor[{name, kind}].push_back(
              {int(i), int(k), s[0].get<int64_t>(), s[1].get<int64_t>(), s[2].get<int64_t>(), s[3].get<int64_t>()});
        }
      }
    }
  }
  for (const auto& [name, t] : mf["tensors"].items()) {
    if (!t.is_object() || !t.contains("shape")) continue;
    const nlohmann::json& sh = t["shape"];
    if (!sh.is_array() || sh.size() != 2 || !sh[0].is_number_integer() || !sh[1].is_number_integer()) continue;
    const int64_t rows = sh[0].get<int64_t>(), cols = sh[1].get<int64_t>();
    if (rows < 1 || cols < 1 || rows > kMaxElements / cols) continue;  // the Reader names the bad shape
    ++st.tensors;
    st.elements += rows * cols;
    for (const std::string& kind : kinds) {
      const auto it = by_tensor.find({name, kind});
      const std::string what = std::string(kind) + "/" + name;
      if (it == by_tensor.end()) {
        problems.push_back(what + ": in no file (all " + std::to_string(rows * cols) + " elements missing)");
        continue;
      }
      std::vector<Listed> inside;
      for (const Listed& s : it->second) {
        if (s.r0 < 0 || s.c0 < 0 || s.nr < 1 || s.nc < 1 || s.r0 > rows - s.nr || s.c0 > cols - s.nc) {
          problems.push_back(where_of(files, s, kind, name) + ": slice [" + std::to_string(s.r0) + ", " +
                             std::to_string(s.c0) + "] + [" + std::to_string(s.nr) + ", " + std::to_string(s.nc) +
                             "] lies outside the tensor's [" + std::to_string(rows) + ", " + std::to_string(cols) +
                             "]");
          continue;
        }
        inside.push_back(s);
      }
      const Coverage cv = sweep_coverage(inside, rows, cols);
      const int64_t holes = rows * cols - cv.covered;
      auto at = [&](int64_t e) {
        std::ostringstream o;
        o << '[' << e / cols << ", " << e % cols << ']';
        return o.str();
      };
      if (holes > 0)
        problems.push_back(what + ": " + std::to_string(holes) + " of " + std::to_string(rows * cols) +
                           " elements in no slice (the first at " + at(cv.first_hole) + ")");
      if (cv.doubled > 0) {
        // Name the slices that share the first doubly stored element.
        const int64_t r = cv.first_doubled / cols, c = cv.first_doubled % cols;
        std::string owners;
        for (const Listed& s : inside)
          if (r >= s.r0 && r < s.r0 + s.nr && c >= s.c0 && c < s.c0 + s.nc)
            owners += (owners.empty() ? "" : " and ") + where_of(files, s, kind, name);
        problems.push_back(what + ": " + std::to_string(cv.doubled) + " elements in more than one slice (the first at " +
                           at(cv.first_doubled) + ", in " + owners + ")");
      }
    }
  }
}

// The datasets of one file against the manifest's list and their own hashes.
void check_datasets(const std::string& folder, const FileRecord& rec, std::vector<std::string>& problems,
                    VerifyStats& st) {
  const std::string path = (fs::path(folder) / rec.name).string();
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.ok()) return;  // Reader::verify reported it (missing, not HDF5)
  // A damaged file can fail every dataset: the first few say enough.
  constexpr int kMaxPerFile = 8;
  int reported = 0, more = 0;
  auto problem = [&](const std::string& ds, const std::string& what) {
    if (reported < kMaxPerFile) problems.push_back(path + ": " + ds + ": " + what), ++reported;
    else ++more;
  };
  std::set<std::string> listed;
  std::vector<float> data;
  for (const auto& [kind, by_name] : rec.slices.items()) {
    for (const auto& [name, arr] : by_name.items()) {
      for (size_t k = 0; k < arr.size(); ++k) {
        const std::string ds_name = "/" + kind + "/" + name + "/" + std::to_string(k);
        listed.insert(ds_name);
        const auto v = arr[k].get<std::vector<int64_t>>();  // shape checked by the Reader
        ++st.datasets;
        H5Id ds(H5Dopen2(f, ds_name.c_str(), H5P_DEFAULT), H5Dclose);
        if (!ds.ok()) {
          problem(ds_name, "missing (the manifest lists it)");
          continue;
        }
        H5Id sp(H5Dget_space(ds), H5Sclose);
        hsize_t dims[2] = {0, 0};
        if (H5Sget_simple_extent_ndims(sp) != 2 || H5Sget_simple_extent_dims(sp, dims, nullptr) != 2 ||
            int64_t(dims[0]) != v[2] || int64_t(dims[1]) != v[3]) {
          problem(ds_name, "shape differs from the manifest's [" + std::to_string(v[2]) + ", " +
                               std::to_string(v[3]) + "]");
          continue;
        }
        std::vector<int64_t> off;
        if (!h5::read_attr_i64(ds, "offset", off) || off.size() != 2 || off[0] != v[0] || off[1] != v[1])
          problem(ds_name, "offset attribute missing or not the manifest's [" + std::to_string(v[0]) + ", " +
                               std::to_string(v[1]) + "]");
        uint64_t want = 0;
        if (!h5::read_attr_u64(ds, "xxh3", want)) {
          problem(ds_name, "no xxh3 attribute");
          continue;
        }
        data.resize(size_t(v[2] * v[3]));
        if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0) {
          problem(ds_name, "unreadable (corrupt)");
          continue;
        }
        // The writer hashed the little-endian float32 bytes it wrote; native
        // float is that on every platform wiola runs on.
        if (XXH3_64bits(data.data(), data.size() * sizeof(float)) != want)
          problem(ds_name, "data does not match its xxh3 attribute (corrupt)");
      }
    }
  }
  data = {};
  // Nothing besides what the manifest lists (a stray dataset is a sign of a
  // mixed-up file even when the listed ones are intact).
  for (const char* kind : kKinds) {
    H5Id g(H5Gopen2(f, kind, H5P_DEFAULT), H5Gclose);
    if (!g.ok()) continue;
    for (const std::string& name : children(g)) {
      H5Id t(H5Gopen2(g, name.c_str(), H5P_DEFAULT), H5Gclose);
      if (!t.ok()) {
        problem(std::string("/") + kind + "/" + name, "not a tensor group");
        continue;
      }
      for (const std::string& k : children(t)) {
        const std::string ds_name = std::string("/") + kind + "/" + name + "/" + k;
        if (!listed.count(ds_name)) problem(ds_name, "in the file but not in the manifest");
      }
    }
  }
  if (more > 0) problems.push_back(path + ": " + std::to_string(more) + " more dataset problems");
}

// Tensor names in model order (embedding, layers by number, final norm)
// when the recorded config describes the model, else in name order.
std::vector<std::string> tensor_order(const Reader& r) {
  std::vector<std::string> out;
  std::set<std::string> done;
  try {
    const ParamLayout lay(model_config(r), ModelShard{});
    for (const ParamEntry& e : lay.entries())
      if (r.manifest()["tensors"].contains(e.name)) out.push_back(e.name), done.insert(e.name);
  } catch (const Error&) {
    // A config this build cannot read: name order it is.
  }
  for (const auto& [name, t] : r.manifest()["tensors"].items())
    if (!done.count(name)) out.push_back(name);
  return out;
}

// Reader::verify's problems as one error naming the folder; then the layout of
// one process holding the whole model its config describes (local = global,
// so a tensor's flat buffer is its global row-major array), checked against
// the tensors the manifest lists.
ParamLayout verified_global_layout(const Reader& r) {
  const std::string& folder = r.folder();
  {
    const auto problems = r.verify();
    if (!problems.empty()) {
      std::string all;
      for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
      fail("checkpoint '", folder, "' is damaged: ", all, " (wiola ckpt verify tells more)");
    }
  }
  ParamLayout lay(model_config(r), ModelShard{});
  for (const ParamEntry& e : lay.entries()) {
    WIOLA_CHECK(r.manifest()["tensors"].contains(e.name), "checkpoint '", folder, "' lacks ", e.name,
                ", a tensor of the model its config describes");
    const auto [rows, cols] = r.shape(e.name);
    WIOLA_CHECK(rows == e.grows && cols == e.gcols, "checkpoint '", folder, "': ", e.name, " is [", rows, ", ",
                cols, "], its config's model has [", e.grows, ", ", e.gcols, "]");
  }
  WIOLA_CHECK(r.manifest()["tensors"].size() == lay.entries().size(), "checkpoint '", folder, "' holds ",
              r.manifest()["tensors"].size(), " tensors, its config's model ", lay.entries().size());
  return lay;
}

// b against a, element by element (a.size() == b.size()).
void diff_values(const std::vector<float>& a, const std::vector<float>& b, TensorDiff& d) {
  d.elements = int64_t(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t ba, bb;
    std::memcpy(&ba, &a[i], 4);
    std::memcpy(&bb, &b[i], 4);
    if (ba == bb) {
      d.sq_ref += double(a[i]) * a[i];  // NaN here: identical NaNs make rel NaN below
      continue;
    }
    ++d.differing;
    const double x = a[i], y = b[i], e = y - x;
    if (!std::isfinite(e)) {
      d.max_abs = d.sq_diff = std::numeric_limits<double>::infinity();
      continue;
    }
    d.max_abs = std::max(d.max_abs, std::abs(e));
    d.sq_diff += e * e;
    d.sq_ref += x * x;
  }
  d.rel = d.differing == 0 ? 0.0 : std::sqrt(d.sq_diff) / std::max(std::sqrt(d.sq_ref), 1e-30);
  if (std::isnan(d.rel)) d.rel = std::numeric_limits<double>::infinity();
}

// The [model] settings of two checkpoints' recorded identities that differ.
std::vector<std::string> model_keys_differ(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> out;
  const nlohmann::json ma = a.value("identity", nlohmann::json::object()).value("model", nlohmann::json::object());
  const nlohmann::json mb = b.value("identity", nlohmann::json::object()).value("model", nlohmann::json::object());
  std::set<std::string> keys;
  for (const auto& [k, v] : ma.items()) keys.insert(k);
  for (const auto& [k, v] : mb.items()) keys.insert(k);
  for (const std::string& k : keys)
    if (!ma.contains(k) || !mb.contains(k) || ma[k] != mb[k]) out.push_back(k);
  return out;
}

}  // namespace

ModelConfig model_config(const Reader& r) {
  const std::string where = (fs::path(r.folder()) / "manifest.json").string() + " (config)";
  const nlohmann::json& mf = r.manifest();
  WIOLA_CHECK(mf.contains("config") && mf["config"].is_string(), where, ": the manifest records no config");
  toml::table model_only;
  try {
    const toml::table all = toml::parse(mf["config"].get<std::string>(), std::string_view(where));
    const toml::table* m = all["model"].as_table();
    WIOLA_CHECK(m, where, ": no [model] table");
    model_only.insert("model", *m);
  } catch (const toml::parse_error& e) {
    fail(where, ": TOML syntax error: ", e.description());
  }
  std::ostringstream text;
  text << model_only;
  return run_config_from_toml_text(text.str(), where).model;
}

nlohmann::json summary(const Reader& r, bool tensors) {
  const nlohmann::json& mf = r.manifest();
  nlohmann::json out = {{"checkpoint", r.folder()}, {"format", mf.value("format", "")}, {"step", r.step()},
                        {"tokens", mf.value("tokens", int64_t(0))}, {"run_id", mf.value("run_id", "")},
                        {"skipped", mf.value("skipped", int64_t(0))},
                        {"applied_steps", mf.value("applied_steps", int64_t(0))}};
  for (const char* k : {"layout", "backend", "precision", "threads_per_rank", "data_path", "data_blend"})
    if (mf.contains(k)) out[k] = mf[k];
  if (mf.contains("identity") && mf["identity"].contains("model")) out["model"] = mf["identity"]["model"];
  nlohmann::json files = nlohmann::json::array();
  uint64_t bytes = 0;
  std::map<std::string, int64_t> stored;
  for (const FileRecord& f : r.files()) {
    files.push_back({{"name", f.name}, {"rank", f.header.rank},
                     {"grid_coord", {{"tp", f.header.tp}, {"pp", f.header.pp}, {"dp", f.header.dp}}},
                     {"bytes", f.bytes}, {"xxh3", f.xxh3}});
    bytes += f.bytes;
    for (const auto& [kind, by_name] : f.slices.items())
      for (const auto& [name, arr] : by_name.items())
        for (const auto& s : arr) stored[kind] += s[2].get<int64_t>() * s[3].get<int64_t>();
  }
  out["files"] = std::move(files);
  out["bytes"] = bytes;
  int64_t params = 0;
  for (const auto& [name, t] : mf["tensors"].items()) {
    const auto [rows, cols] = r.shape(name);
    params += rows * cols;
  }
  out["tensors"] = mf["tensors"].size();
  out["parameters"] = params;
  nlohmann::json el = nlohmann::json::object();
  for (const char* k : kKinds) el[k] = stored[k];
  out["elements"] = std::move(el);
  if (tensors) {
    nlohmann::json list = nlohmann::json::array();
    for (const std::string& name : tensor_order(r)) {
      const auto [rows, cols] = r.shape(name);
      nlohmann::json by_file = nlohmann::json::object();
      for (const FileRecord& f : r.files())
        for (const auto& [kind, by_name] : f.slices.items())
          if (by_name.contains(name)) by_file[f.name][kind] = by_name[name];
      list.push_back({{"name", name}, {"shape", {rows, cols}}, {"slices", std::move(by_file)}});
    }
    out["tensor_list"] = std::move(list);
  }
  return out;
}

std::vector<std::string> verify_deep(const std::string& folder, VerifyStats* stats) {
  quiet_hdf5();
  VerifyStats st;
  std::vector<std::string> problems;
  std::unique_ptr<Reader> r;
  try {
    r = std::make_unique<Reader>(folder);
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  // The coverage map from the manifest as written, also when the Reader
  // refused it: it says where every hole and overlap is.
  nlohmann::json mf;
  if (r) {
    mf = r->manifest();
  } else {
    std::ifstream in(fs::path(folder) / "manifest.json");
    mf = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  // Every line names a file: the manifest for coverage, else the rank file.
  std::vector<std::string> coverage;
  check_coverage(mf, coverage, st);
  const fs::path dir(folder);
  for (const std::string& p : coverage) problems.push_back((dir / "manifest.json").string() + ": " + p);
  if (r) {
    st.files = int(r->files().size());
    const std::string base = (dir / "").string();  // Reader::verify names files relative to the folder
    for (const std::string& p : r->verify()) problems.push_back(base + p);
    for (const FileRecord& rec : r->files()) check_datasets(folder, rec, problems, st);
  }
  if (stats) *stats = st;
  return problems;
}

ConsolidateStats consolidate(const std::string& folder, const std::string& out, bool with_optimizer) {
  quiet_hdf5();
  Reader r(folder);
  WIOLA_CHECK(!with_optimizer || holds_optimizer(r.manifest()), folder,
              ": holds weights only (no optimizer state): drop --with-optimizer");
  const ParamLayout lay = verified_global_layout(r);

  const std::string tmp = out + ".tmp";
  ConsolidateStats st;
  st.step = r.step();
  try {
    {
      H5Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
      if (!f.ok()) {
        const int e = h5::last_errno();
        fail(tmp, ": cannot create: ", e ? std::strerror(e) : "directory missing or not writable?");
      }
      // On any error (a full disk above all) HDF5's remaining writes go to
      // memory (h5::discard_writes), so that every handle closes cleanly:
      // `need` switches at a failed write, before the handles of the tensor
      // close; this guard, for any other error, before `f` closes.
      struct DiscardOnError {
        hid_t f;
        int pending = std::uncaught_exceptions();
        ~DiscardOnError() {
          if (std::uncaught_exceptions() > pending) h5::discard_writes(f);
        }
      } discard_on_error{f};
      auto need = [&](bool ok, const std::string& what) {
        if (ok) return;
        const int e = h5::last_errno();  // before discard_writes's HDF5 calls clear the error stack
        h5::discard_writes(f);
        if (e) fail(tmp, ": write failed at ", what, ": ", std::strerror(e));
        h5::need(false, tmp, what);
      };
      const nlohmann::json& mf = r.manifest();
      attr_str(tmp, f, "format", kConsolidatedFormat);
      attr_str(tmp, f, "run_id", mf.value("run_id", ""));
      attr_i64(tmp, f, "step", r.step());
      attr_i64(tmp, f, "tokens", mf.value("tokens", int64_t(0)));
      attr_str(tmp, f, "config", mf.value("config", ""));
      std::vector<float> buf;
      for (const char* kind : kKinds) {
        if (!with_optimizer && std::string(kind) != "param") continue;
        H5Id g(H5Gcreate2(f, kind, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
        need(g.ok(), kind);
        for (const ParamEntry& e : lay.entries()) {
          buf.resize(e.size());
          r.read(kind, e, 0, e.size(), buf.data());
          const int rank = e.is_matrix() ? 2 : 1;
          const hsize_t dims[2] = {hsize_t(e.grows), hsize_t(e.gcols)};
          H5Id sp(H5Screate_simple(rank, dims, nullptr), H5Sclose);
          H5Id ds(H5Dcreate2(g, e.name.c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  H5Dclose);
          const std::string what = std::string(kind) + "/" + e.name;
          need(sp.ok() && ds.ok() && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
               what);
          if (std::string(kind) == "param") ++st.tensors, st.elements += int64_t(e.size());
        }
      }
      // The metadata HDF5 still holds goes to space reserved first: a full
      // disk is found before HDF5's flush, which could not recover from it.
      if (const int e = h5::reserve_allocated(f)) {
        h5::discard_writes(f);
        fail(tmp, ": write failed at flush: ", std::strerror(e));
      }
      need(H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0, "flush");
    }
    fsync_path(tmp);
    WIOLA_CHECK(std::rename(tmp.c_str(), out.c_str()) == 0, out, ": cannot rename ", tmp, " into place");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  st.bytes = uint64_t(fs::file_size(out));
  return st;
}

DiffResult diff(const std::string& folder_a, const std::string& folder_b, bool with_optimizer) {
  quiet_hdf5();
  Reader ra(folder_a), rb(folder_b);
  for (const Reader* r : {&ra, &rb})
    WIOLA_CHECK(!with_optimizer || holds_optimizer(r->manifest()), r->folder(),
                ": holds weights only (no optimizer state): drop --with-optimizer");
  const ParamLayout lay = verified_global_layout(ra);
  const size_t tensors_b = verified_global_layout(rb).entries().size();
  WIOLA_CHECK(tensors_b == lay.entries().size(), "'", folder_a, "' holds ", lay.entries().size(), " tensors, '",
              folder_b, "' ", tensors_b, ": not the same model");
  for (const ParamEntry& e : lay.entries()) {
    WIOLA_CHECK(rb.manifest()["tensors"].contains(e.name), "checkpoint '", folder_b, "' lacks ", e.name,
                ", which '", folder_a, "' holds: not the same model");
    const auto [rows, cols] = rb.shape(e.name);
    WIOLA_CHECK(rows == e.grows && cols == e.gcols, e.name, " is [", e.grows, ", ", e.gcols, "] in '", folder_a,
                "' and [", rows, ", ", cols, "] in '", folder_b, "': not the same model");
  }
  DiffResult res;
  res.folder_a = folder_a, res.folder_b = folder_b;
  res.summary_a = summary(ra, false), res.summary_b = summary(rb, false);
  res.model_keys_differ = model_keys_differ(ra.manifest(), rb.manifest());
  double sq_diff = 0, sq_ref = 0;
  std::vector<float> a, b;
  for (const char* kind : kKinds) {
    if (!with_optimizer && std::string(kind) != "param") continue;
    for (const ParamEntry& e : lay.entries()) {
      a.resize(e.size()), b.resize(e.size());
      ra.read(kind, e, 0, e.size(), a.data());
      rb.read(kind, e, 0, e.size(), b.data());
      TensorDiff d;
      d.kind = kind, d.name = e.name;
      diff_values(a, b, d);
      if (d.kind == "param") {
        sq_diff += d.sq_diff, sq_ref += d.sq_ref;
        res.elements += d.elements, res.differing += d.differing;
      }
      res.tensors.push_back(std::move(d));
    }
  }
  res.model_rel = res.differing == 0 ? 0.0 : std::sqrt(sq_diff) / std::max(std::sqrt(sq_ref), 1e-30);
  if (std::isnan(res.model_rel)) res.model_rel = std::numeric_limits<double>::infinity();
  return res;
}

}  // namespace wiola::ckpt
