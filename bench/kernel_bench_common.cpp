// wiola_kernel_bench's shared pieces (kernel_bench.h): shapes, the report,
// timing, buffers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "bench/kernel_bench.h"
#include "kernels/scalar.h"

namespace kernel_bench {

Shapes make_shapes(bool small, const std::string& preset) {
  Shapes s;
  s.cfg = wiola::model_preset(preset);
  s.T = std::min(s.T, s.cfg.T);
  if (small) {
    const int dh = preset == "wiola-360m" ? 32 : s.cfg.dh();  // the default's dry run as it always was
    s.cfg.name = preset == "wiola-360m" ? "kernel-bench-small" : "kernel-bench-small-" + preset;
    s.cfg.d = 4 * dh;
    s.cfg.L = 1;
    s.cfg.H = 4;
    s.cfg.Hkv = 2;
    s.cfg.dA = 4 * dh;
    s.cfg.dB = 16 * dh;
    s.cfg.V = 512;
    s.cfg.T = 64;
    s.B = 2;
    s.T = 64;
    s.check_B = 1;
    s.check_T = 80;
  }
  s.cfg.validate();
  return s;
}

Report::Report(const std::string& path, bool append) {
  if (path.empty()) return;
  if (append) {
    if (std::FILE* in = std::fopen(path.c_str(), "r")) {
      std::string text;
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) text.append(buf, n);
      std::fclose(in);
      for (size_t a = 0, b; a < text.size(); a = b + 1) {
        b = std::min(text.find('\n', a), text.size());
        const json j = json::parse(text.substr(a, b - a), nullptr, false);  // a cut-off line: skipped
        if (j.is_object()) rows_.push_back(j);
      }
    }
  }
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  WIOLA_CHECK(f_, "wiola_kernel_bench: cannot write ", path);
}

void Report::emit(const json& j) {
  rows_.push_back(j);
  if (!f_) return;
  std::fprintf(f_, "%s\n", j.dump().c_str());
  std::fflush(f_);
}

Timing time_op(Ops<float>& ops, const Options& o, const std::function<void()>& f) {
  for (int i = 0; i < o.warmup; ++i) f();
  ops.synchronize();
  auto tl = ops.make_timeline();
  std::vector<int> marks{tl->mark()};
  for (int i = 0; i < o.reps; ++i) {
    f();
    marks.push_back(tl->mark());
  }
  ops.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < o.reps; ++i) ms.push_back(1e3 * tl->seconds(marks[size_t(i)], marks[size_t(i) + 1]));
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.reps = o.reps;
  t.ms_min = ms.front();
  t.ms_max = ms.back();
  const size_t n = ms.size();
  t.ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return t;
}

void put_timing(json& j, const Timing& t) {
  j["ms"] = t.ms;
  j["ms_min"] = t.ms_min;
  j["ms_max"] = t.ms_max;
  j["reps"] = t.reps;
}

std::string put_error(Ops<float>& g, json& j, const std::exception& e) {
  g.synchronize();
  j["ok"] = false;
  j["error"] = e.what();
  return std::string("ERROR: ") + e.what();
}

Rated time_rated(Ops<float>& g, const Options& o, json& j, const RateUnit& u, double amount, double peak,
                 const std::function<void()>& f) {
  Rated r;
  try {
    const Timing t = time_op(g, o, f);
    put_timing(j, t);
    const double rate = amount / (t.ms * 1e-3) / u.scale;
    j[u.key] = rate;
    j["frac_peak"] = rate / peak;
    j["ok"] = true;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%8.3f ms  %7.1f %s (%4.0f %% of %.0f)", t.ms, rate, u.unit, 100 * rate / peak,
                  peak);
    r = {true, t.ms, buf};
  } catch (const std::exception& e) {
    g.synchronize();
    j["ok"] = false;
    j["error"] = e.what();
    r.line = std::string("ERROR: ") + e.what();
  }
  return r;
}

Vec randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Host values rounded to bf16, uploaded as bf16; returns the rounded values.
Vec upload_bf16(Ops<float>& ops, const Vec& h, DynBuffer<float>& dst) {
  std::vector<uint16_t> bits(h.size());
  Vec r(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    bits[i] = wiola::bf16_round(h[i]);
    r[i] = wiola::bf16_widen(bits[i]);
  }
  ops.upload(dst.data().raw(), bits.data(), bits.size() * 2);
  return r;
}

Vec download_bf16(Ops<float>& ops, CPtr src, size_t n) {
  std::vector<uint16_t> bits(n);
  ops.download(bits.data(), src.raw(), n * 2);
  Vec r(n);
  for (size_t i = 0; i < n; ++i) r[i] = wiola::bf16_widen(bits[i]);
  return r;
}

void fill(Ops<float>& ops, Ptr p, size_t n, uint64_t seed, bool positive) {
  if (!n) return;
  const size_t es = wiola::dtype_bytes(p.dtype());
  const size_t block = std::min<size_t>(n, size_t(1) << 20);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(positive ? 0.f : -1.f, 1.f);
  std::vector<unsigned char> host(block * es);
  for (size_t i = 0; i < block; ++i) {
    const float x = u(g);
    if (p.dtype() == DType::BF16) {
      const uint16_t b = wiola::bf16_round(x);
      std::memcpy(&host[i * es], &b, 2);
    } else {
      WIOLA_CHECK(p.dtype() == DType::F32, "fill: float32 or bfloat16 buffers only");
      std::memcpy(&host[i * es], &x, 4);
    }
  }
  char* base = static_cast<char*>(p.raw());
  ops.upload(base, host.data(), block * es);
  for (size_t done = block; done < n;) {
    const size_t c = std::min(done, n - done);
    ops.copy(base + done * es, base, c * es);
    done += c;
  }
}

double rel(const Vec& ref, const Vec& got, double floor) {
  double d = 0, m = floor;
  for (size_t i = 0; i < ref.size(); ++i) {
    d = std::max(d, std::abs(double(ref[i]) - double(got[i])));
    m = std::max(m, std::abs(double(ref[i])));
  }
  return d / m;
}

const char* dtype_short(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F32 ? "f32" : "?"; }

}  // namespace kernel_bench
