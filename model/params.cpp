#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "util/error.h"

namespace wiola {

std::string layer_param_name(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

namespace {

// Global row indices of the local query heads (and gate / o_proj columns):
// local head lh uses local group lh % Hkv_loc, i.e. global group
// g = tp_rank*Hkv_loc + lh % Hkv_loc, and global head h = g + (lh / Hkv_loc)*Hkv,
// so g(h) = h mod Hkv holds globally and locally.
std::vector<int32_t> query_rows(const ModelConfig& c, const ModelShard& s) {
  const LocalDims ld(c, s);
  std::vector<int32_t> rows;
  if (s.tp_size == 1) return rows;
  for (int lh = 0; lh < ld.H; ++lh) {
    const int g = s.tp_rank * ld.Hkv + lh % ld.Hkv;
    const int h = g + (lh / ld.Hkv) * c.Hkv;
    for (int i = 0; i < ld.dh; ++i) rows.push_back(h * ld.dh + i);
  }
  return rows;
}

std::vector<int32_t> range_rows(int begin, int count, int tp_size) {
  std::vector<int32_t> rows;
  if (tp_size == 1) return rows;
  for (int i = 0; i < count; ++i) rows.push_back(begin + i);
  return rows;
}

}  // namespace

void ParamLayout::add(ParamEntry e) {
  WIOLA_CHECK(!e.follows || !entries_.empty(), "internal: ", e.name, " follows no entry");
  e.offset = e.follows ? total_ : (total_ + align_ - 1) / align_ * align_;
  if (!entries_.empty()) entries_.back().span = e.offset - entries_.back().offset;
  e.span = e.size();
  total_ = e.offset + e.size();
  elements_ += e.size();
  entries_.push_back(std::move(e));
}

std::vector<ParamLayout::Range> ParamLayout::padding() const {
  std::vector<Range> out;
  for (const ParamEntry& e : entries_)
    if (e.span > e.size()) out.push_back({e.offset + e.size(), e.span - e.size()});
  return out;
}

ParamLayout::ParamLayout(const ModelConfig& c, const ModelShard& s, size_t align)
    : ParamLayout(c, s.tp_rank, s.tp_size, {{s.layer_begin, s.end(c)}}, align) {}

ParamLayout::ParamLayout(const ModelConfig& c, int tp_rank, int tp_size, LayerRanges ranges,
                         size_t align)
    : align_(align) {
  WIOLA_CHECK(align_ >= 1, "parameter alignment must be at least 1 element");
  WIOLA_CHECK(!ranges.empty(), "internal: a parameter layout of no layer range");
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 0; i < ranges.size(); ++i)
    WIOLA_CHECK(ranges[i].first >= 0 && ranges[i].first < ranges[i].second && ranges[i].second <= c.L &&
                    (i == 0 || ranges[i - 1].second <= ranges[i].first),
                "layer ranges of one parameter layout must be non-empty, inside 0..", c.L, " and disjoint");
  const ModelShard s{tp_rank, tp_size, ranges.front().first, ranges.back().second};
  const LocalDims ld(c, s);
  const int d = c.d, hd = c.H * c.dh(), kvd = c.Hkv * c.dh();
  const int lhd = ld.H * ld.dh, lkvd = ld.Hkv * ld.dh;
  const auto qrows = query_rows(c, s);
  const auto kvrows = range_rows(s.tp_rank * lkvd, lkvd, s.tp_size);
  const auto arows = range_rows(s.tp_rank * ld.dA, ld.dA, s.tp_size);
  const auto brows = range_rows(s.tp_rank * ld.dB, ld.dB, s.tp_size);

  auto vec = [&](std::string name, InitKind init, double value, bool decay) {
    ParamEntry e;
    e.name = std::move(name);
    e.rows = e.grows = d;
    e.init = init; e.init_value = value; e.decay = decay;
    e.tp_replicated = true;
    return e;
  };
  auto mat = [&](std::string name, int64_t rows, int64_t cols, int64_t grows,
                 int64_t gcols, std::vector<int32_t> rmap,
                 std::vector<int32_t> cmap, bool replicated) {
    ParamEntry e;
    e.name = std::move(name);
    e.rows = rows; e.cols = cols; e.grows = grows; e.gcols = gcols;
    e.row_map = std::move(rmap); e.col_map = std::move(cmap);
    e.tp_replicated = replicated;
    e.init_value = c.init_std;  // Normal(0, init_std^2)
    return e;
  };

  // The embedding where a range starts the model (the lookup) or ends it
  // (the tied head), once; the final norm with the head.
  const bool has_embed = ranges.front().first == 0 || ranges.back().second == c.L;
  if (has_embed) {
    add(mat("model.embed_tokens.weight", ld.V, d, c.V, d,
            range_rows(ld.v0, ld.V, s.tp_size), {}, false));
  }
  auto follows = [](ParamEntry e) {
    e.follows = true;
    return e;
  };
  for (const auto& [r0, r1] : ranges)
  for (int l = r0; l < r1; ++l) {
    auto n = [&](const char* suffix) { return layer_param_name(l, suffix); };
    add(vec(n("input_layernorm.weight"), InitKind::Ones, 0, false));
    add(vec(n("input_layernorm.offset"), InitKind::Zeros, 0, false));
    // q, k, v and gate read the same input and sit next to each other, so
    // the four are one [H dh + 2 Hkv dh + H dh, d] matrix for one GEMM
    // (LayerParams::wqkvg): only q is aligned, k, v and gate follow it with
    // no padding (in the presets each is a multiple of kParamAlign anyway).
    add(mat(n("self_attn.q_proj.weight"), lhd, d, hd, d, qrows, {}, false));
    add(follows(mat(n("self_attn.k_proj.weight"), lkvd, d, kvd, d, kvrows, {}, false)));
    add(follows(mat(n("self_attn.v_proj.weight"), lkvd, d, kvd, d, kvrows, {}, false)));
    add(follows(mat(n("self_attn.gate_proj.weight"), lhd, d, hd, d, qrows, {}, false)));
    // The context keys and values read the same summary: ctx_v_proj follows
    // ctx_k_proj with no padding, one [2 Hkv dh, d] matrix (LayerParams::wkvc)
    // for one GEMM per summary and direction.
    add(mat(n("self_attn.ctx_k_proj.weight"), lkvd, d, kvd, d, kvrows, {}, false));
    add(follows(mat(n("self_attn.ctx_v_proj.weight"), lkvd, d, kvd, d, kvrows, {}, false)));
    add(mat(n("self_attn.o_proj.weight"), d, lhd, d, hd, {}, qrows, false));
    {
      ParamEntry phi;
      phi.name = n("self_attn.ctx_gate_logit");
      phi.rows = phi.grows = 1;
      phi.init = InitKind::Constant; phi.init_value = c.phi_init;
      phi.decay = false; phi.tp_replicated = true;
      add(phi);
    }
    add(vec(n("post_attention_layernorm.weight"), InitKind::Ones, 0, false));
    add(vec(n("post_attention_layernorm.offset"), InitKind::Zeros, 0, false));
    add(mat(n("mlp.stream_a_gate.weight"), ld.dA, d, c.dA, d, arows, {}, false));
    add(mat(n("mlp.stream_a_up.weight"), ld.dA, d, c.dA, d, arows, {}, false));
    add(mat(n("mlp.stream_a_down.weight"), d, ld.dA, d, c.dA, {}, arows, false));
    add(mat(n("mlp.stream_b_up.weight"), ld.dB, d, c.dB, d, brows, {}, false));
    add(mat(n("mlp.stream_b_down.weight"), d, ld.dB, d, c.dB, {}, brows, false));
    // The fusion gate needs whole a and b; it is replicated on TP ranks.
    add(mat(n("mlp.fusion.weight"), d, 2 * d, d, 2 * d, {}, {}, true));
  }
  if (ranges.back().second == c.L) {
    add(vec("model.norm.weight", InitKind::Ones, 0, false));
    add(vec("model.norm.offset", InitKind::Zeros, 0, false));
  }
}

const ParamEntry* ParamLayout::try_find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ParamEntry& ParamLayout::find(const std::string& name) const {
  const ParamEntry* e = try_find(name);
  WIOLA_CHECK(e, "no parameter named '", name, "' in this model layout");
  return *e;
}

ModelParams ModelParams::bind_forward(const ParamLayout& layout, Ptr weights, Ptr master,
                                      const ModelConfig& cfg, const ModelShard& shard) {
  ModelParams p;
  auto at = [&](const std::string& name) {
    const ParamEntry& e = layout.find(name);
    return (e.is_matrix() ? weights : master) + e.offset;
  };
  if (shard.first_stage() || shard.last_stage(cfg)) p.embed = at("model.embed_tokens.weight");
  if (shard.last_stage(cfg)) {
    p.norm_g = at("model.norm.weight");
    p.norm_d = at("model.norm.offset");
  }
  for (int l = shard.layer_begin; l < shard.end(cfg); ++l) {
    auto n = [&](const char* s) { return at(layer_param_name(l, s)); };
    LayerParams lp{};
    lp.ln1_g = n("input_layernorm.weight");
    lp.ln1_d = n("input_layernorm.offset");
    lp.wq = n("self_attn.q_proj.weight");
    lp.wk = n("self_attn.k_proj.weight");
    lp.wv = n("self_attn.v_proj.weight");
    lp.wkc = n("self_attn.ctx_k_proj.weight");
    lp.wvc = n("self_attn.ctx_v_proj.weight");
    lp.wgate = n("self_attn.gate_proj.weight");
    {
      const ParamEntry& q = layout.find(layer_param_name(l, "self_attn.q_proj.weight"));
      const ParamEntry& k = layout.find(layer_param_name(l, "self_attn.k_proj.weight"));
      const ParamEntry& v = layout.find(layer_param_name(l, "self_attn.v_proj.weight"));
      const ParamEntry& g = layout.find(layer_param_name(l, "self_attn.gate_proj.weight"));
      WIOLA_CHECK(k.offset == q.offset + q.size() && v.offset == k.offset + k.size() &&
                      g.offset == v.offset + v.size(),
                  "layer ", l, ": q, k, v and gate projections are not adjacent in the parameter layout");
      lp.wqkvg = lp.wq;
    }
    {
      const ParamEntry& kc = layout.find(layer_param_name(l, "self_attn.ctx_k_proj.weight"));
      const ParamEntry& vc = layout.find(layer_param_name(l, "self_attn.ctx_v_proj.weight"));
      WIOLA_CHECK(vc.offset == kc.offset + kc.size(),
                  "layer ", l, ": the context k and v projections are not adjacent in the parameter layout");
      lp.wkvc = lp.wkc;
    }
    lp.wo = n("self_attn.o_proj.weight");
    lp.phi = n("self_attn.ctx_gate_logit");
    lp.ln2_g = n("post_attention_layernorm.weight");
    lp.ln2_d = n("post_attention_layernorm.offset");
    lp.ga = n("mlp.stream_a_gate.weight");
    lp.ua = n("mlp.stream_a_up.weight");
    lp.da = n("mlp.stream_a_down.weight");
    lp.ub = n("mlp.stream_b_up.weight");
    lp.db = n("mlp.stream_b_down.weight");
    lp.wf = n("mlp.fusion.weight");
    p.layers.push_back(lp);
  }
  return p;
}

ModelParams ModelParams::bind(const ParamLayout& layout, Ptr base, const ModelConfig& cfg,
                              const ModelShard& shard) {
  return bind_forward(layout, base, base, cfg, shard);
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}
}  // namespace

uint64_t counter_key(uint64_t seed, const std::string& name) { return splitmix64(seed ^ splitmix64(fnv1a(name))); }

double counter_normal(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = (double(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double counter_normal(uint64_t seed, const std::string& name, uint64_t index) {
  return counter_normal(counter_key(seed, name), index);
}

// Every element is a pure function of (seed, name, global index), so the rows
// split over threads freely: the values do not depend on the thread count.
// (A 1.5B model is 2.2e9 draws: minutes on one core, seconds on all.)
template <class T>
void init_params_host(const ParamLayout& layout, uint64_t seed, T* out) {
  for (const ParamLayout::Range& r : layout.padding()) std::fill_n(out + r.offset, r.size, T(0));
  for (const ParamEntry& e : layout.entries()) {
    T* p = out + e.offset;
    const uint64_t key = counter_key(seed, e.name);
#pragma omp parallel for schedule(static) if (e.size() > (1 << 16))
    for (int64_t r = 0; r < e.rows; ++r) {
      for (int64_t c = 0; c < e.cols; ++c) {
        double v = 0;
        switch (e.init) {
          case InitKind::Normal: v = e.init_value * counter_normal(key, uint64_t(e.global_index(r, c))); break;
          case InitKind::Ones: v = 1; break;
          case InitKind::Zeros: v = 0; break;
          case InitKind::Constant: v = e.init_value; break;
        }
        p[r * e.cols + c] = T(v);
      }
    }
  }
}

template void init_params_host<float>(const ParamLayout&, uint64_t, float*);
template void init_params_host<double>(const ParamLayout&, uint64_t, double*);

}  // namespace wiola
