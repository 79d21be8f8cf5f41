// wiola_kernel_bench's attention section: every forward and backward variant
// (backend options attention, attention_bwd, their tiles and head packing),
// checked against the CPU on a small problem, then timed at the step's shape;
// then the documents row: forward + backward of the causal window against the
// same windows holding packed documents (run_attention_documents).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/document_layout.h"
#include "bench/kernel_bench_attention.h"
#include "kernels/atm_plan.h"

namespace kernel_bench {

double attn_fwd_flops(const AttnShape& s) { return 2.0 * 2.0 * s.B * s.H * double(s.Tq) * s.Tq * s.dh / 2.0; }

namespace {

// The ATM merge plan as model/layer.cpp's atm_decide makes it: cosine of
// neighbouring rows of X-tilde (fp32, [B, T, d]) and Algorithm 1, on the
// backend. X is random, so tau is chosen from the similarities themselves:
// the smallest that merges at most 25 % of the adjacent pairs (Algorithm 1's
// greedy pass run on the host to pick it, then on the backend for the plan).
void atm_plan_for(Ops<float>& g, AttnProblem& p, int d, uint64_t seed) {
  const int B = p.s.B, T = p.s.Tq;
  Buffer<float> x(g, size_t(B) * T * d);
  const Vec hx = randn(x.size(), seed);
  g.upload(x.data(), hx.data(), x.bytes());
  Buffer<float, double> rho(g, size_t(B) * (T - 1));
  g.atm_similarity(x.data(), B, T, d, rho.data());
  const std::vector<double> hr = download_vec(g, rho.data(), rho.size());
  auto merged = [&](double tau) {
    std::vector<uint8_t> open(static_cast<size_t>(T));
    size_t n = 0;
    for (int b = 0; b < B; ++b) {
      wiola::atm_greedy_row(hr.data() + size_t(b) * (T - 1), T, tau, open.data());
      for (uint8_t o : open) n += o;
    }
    return double(n) / (double(B) * (T - 1));
  };
  std::vector<double> sorted = hr;
  std::sort(sorted.begin(), sorted.end());
  size_t lo = 0, hi = sorted.size() - 1;  // merged(sorted[hi]) == 0 <= 0.25
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (merged(sorted[mid]) <= 0.25) hi = mid;
    else lo = mid + 1;
  }
  p.tau = sorted[lo];
  p.merged_pairs = merged(p.tau);
  const size_t bt = size_t(B) * T;
  p.open = Buffer<float, uint8_t>(g, bt);
  p.group_first = Buffer<float, int32_t>(g, bt);
  p.key_end = Buffer<float, int32_t>(g, bt);
  p.n_groups = Buffer<float, int32_t>(g, size_t(B));
  g.atm_plan(rho.data(), B, T, p.tau, nullptr, p.open.data(), p.group_first.data(), p.key_end.data(),
             p.n_groups.data());
  const int w = p.s.Hkv * p.s.dh;
  g.atm_merge_rows(p.k.data(), B, T, w, p.group_first.data(), p.key_end.data(), p.n_groups.data(), p.mk.data());
  g.atm_merge_rows(p.v.data(), B, T, w, p.group_first.data(), p.key_end.data(), p.n_groups.data(), p.mv.data());
  const std::vector<int32_t> ng = download_vec(g, p.n_groups.data(), size_t(B));
  double keys = 0;
  for (int32_t n : ng) keys += n;
  p.keys_frac = keys / double(bt);
}

}  // namespace

std::unique_ptr<AttnProblem> make_attn(Ops<float>& g, const Shapes& sh, int B, int T, bool atm, uint64_t seed,
                                       int mean_doc_len) {
  auto p = std::make_unique<AttnProblem>();
  AttnShape& s = p->s;
  s.B = B;
  s.Tq = s.Tk = T;
  s.H = sh.cfg.H;
  s.Hkv = sh.cfg.Hkv;
  s.dh = sh.dh();
  p->atm = atm;
  p->nq = size_t(B) * T * s.H * s.dh;
  p->nk = size_t(B) * T * s.Hkv * s.dh;
  p->nl = size_t(B) * s.H * T;
  auto bf = [&](size_t n) { return DynBuffer<float>(g, DType::BF16, n); };
  p->q = bf(p->nq);
  p->k = bf(p->nk);
  p->v = bf(p->nk);
  p->dout = bf(p->nq);
  p->o = bf(p->nq);
  p->dq = bf(p->nq);
  p->dk = bf(p->nk);
  p->dv = bf(p->nk);
  p->lse = Buffer<float>(g, p->nl);
  p->hq = upload_bf16(g, randn(p->nq, seed + 1), p->q);
  p->hk = upload_bf16(g, randn(p->nk, seed + 2), p->k);
  p->hv = upload_bf16(g, randn(p->nk, seed + 3), p->v);
  p->hdout = upload_bf16(g, randn(p->nq, seed + 4), p->dout);
  if (atm) {
    p->mk = bf(p->nk);
    p->mv = bf(p->nk);
    p->drk = bf(p->nk);
    p->drv = bf(p->nk);
    atm_plan_for(g, *p, sh.cfg.d, seed + 5);
  }
  if (mean_doc_len > 0) {
    p->hdoc = wiola::bench::random_documents(B, T, mean_doc_len);
    p->doc_start = Buffer<float, int32_t>(g, p->hdoc.size());
    g.upload(p->doc_start.data(), p->hdoc.data(), p->doc_start.bytes());
  }
  g.synchronize();
  return p;
}

std::vector<Vec> cpu_reference(Ops<float>& g, const AttnProblem& p) {
  auto cpu = wiola::make_cpu_ops<float>();
  const Vec mk = p.atm ? download_bf16(g, p.mk.data(), p.nk) : p.hk;
  const Vec mv = p.atm ? download_bf16(g, p.mv.data(), p.nk) : p.hv;
  std::vector<Buffer<float>> bufs;
  auto in = [&](const Vec& h) {
    bufs.emplace_back(*cpu, h.size());
    cpu->upload(bufs.back().data(), h.data(), h.size() * sizeof(float));
    return bufs.back().data();
  };
  float *q = in(p.hq), *k = in(mk), *v = in(mv), *rk = in(p.hk), *rv = in(p.hv), *dout = in(p.hdout);
  float *o = in(Vec(p.nq)), *lse = in(Vec(p.nl)), *dq = in(Vec(p.nq)), *dk = in(Vec(p.nk)), *dv = in(Vec(p.nk));
  float *drk = in(Vec(p.nk)), *drv = in(Vec(p.nk));
  const size_t bt = size_t(p.s.B) * p.s.Tq;
  Buffer<float, int32_t> ke(*cpu, bt), ng(*cpu, size_t(p.s.B));
  Buffer<float, uint8_t> so(*cpu, bt);
  Buffer<float, int32_t> ds(*cpu, p.hdoc.size());
  AttnKeys keys{};
  if (p.atm) {
    cpu->upload(ke.data(), download_vec(g, p.key_end.data(), bt).data(), ke.bytes());
    cpu->upload(ng.data(), download_vec(g, p.n_groups.data(), size_t(p.s.B)).data(), ng.bytes());
    cpu->upload(so.data(), download_vec(g, p.open.data(), bt).data(), so.bytes());
    keys = AttnKeys{ke.data(), ng.data(), so.data()};
  }
  if (!p.hdoc.empty()) {
    cpu->upload(ds.data(), p.hdoc.data(), ds.bytes());
    keys.doc_start = ds.data();
  }
  cpu->attention_fwd(p.s, keys, q, k, v, p.atm ? rk : nullptr, p.atm ? rv : nullptr, o, lse);
  cpu->attention_bwd(p.s, keys, q, k, v, p.atm ? rk : nullptr, p.atm ? rv : nullptr, o, lse, dout, dq, dk, dv,
                     p.atm ? drk : nullptr, p.atm ? drv : nullptr);
  auto out = [&](const float* x, size_t n) { return download_vec(*cpu, x, n); };
  std::vector<Vec> r{out(o, p.nq), out(lse, p.nl), out(dq, p.nq), out(dk, p.nk), out(dv, p.nk)};
  if (p.atm) {
    r.push_back(out(drk, p.nk));
    r.push_back(out(drv, p.nk));
  }
  return r;
}

namespace {

struct AttnVariant {
  std::string name;  // as in the JSON: "fwd tc", "bwd v2", "fwd fa2 128x64", ...
  bool bwd;
  wiola::AttentionFwd attention;  // its backend options
  wiola::AttentionBwd attention_bwd;
  std::optional<wiola::AttentionTile> attention_tile;      // the fa2 forward's tile; none: the bench's own
  std::optional<wiola::AttentionTile> attention_bwd_tile;  // the fa2 backward's tile; none: the bench's own
  std::optional<wiola::HeadsPerBlock> heads_per_block;     // the fa2 forward's heads a block; none: the bench's own
  // The options of its forward (a backward variant reads the o and lse of
  // the default tensor-core forward).
  wiola::BackendOptions fwd(const wiola::BackendOptions& base) const {
    wiola::BackendOptions o = base;
    o.attention = bwd ? wiola::AttentionFwd::Tc : attention;
    o.attention_tile = attention_tile.value_or(o.attention_tile);
    o.attention_heads_per_block = heads_per_block.value_or(o.attention_heads_per_block);
    return o;
  }
  wiola::BackendOptions all(const wiola::BackendOptions& base) const {
    wiola::BackendOptions o = fwd(base);
    o.attention = attention;
    o.attention_bwd = attention_bwd;
    o.attention_bwd_tile = attention_bwd_tile.value_or(o.attention_bwd_tile);
    return o;
  }
};

// The check: the variant's outputs on the small problem against the CPU.
// (A backward variant's forward is the default tensor-core one: the
// backward reads its o and lse.) Returns the max relative error per output.
json check_variant(Ops<float>& g, const wiola::BackendOptions& base, AttnProblem& p, const std::vector<Vec>& ref,
                   const AttnVariant& var, bool& ok) {
  std::vector<Vec> got;
  {
    OptionsScope fwd_opt(g, base, var.fwd(base));
    p.fwd(g);
  }
  got.push_back(download_bf16(g, p.o.data(), p.nq));
  got.push_back(download_vec(g, p.lse.data(), p.nl));
  if (var.bwd) {
    OptionsScope bwd_opt(g, base, var.all(base));
    p.bwd(g);
    got.push_back(download_bf16(g, p.dq.data(), p.nq));
    got.push_back(download_bf16(g, p.dk.data(), p.nk));
    got.push_back(download_bf16(g, p.dv.data(), p.nk));
    if (p.atm) {
      got.push_back(download_bf16(g, p.drk.data(), p.nk));
      got.push_back(download_bf16(g, p.drv.data(), p.nk));
    }
  }
  json err = json::object(), tol = json::object();
  ok = true;
  // A backward variant is judged on its gradients (its o and lse are tc's).
  for (size_t t = var.bwd ? 2 : 0; t < got.size(); ++t) {
    const double e = rel(ref[t], got[t]);
    err[kAttnNames[t]] = e;
    tol[kAttnNames[t]] = kAttnTols[t];
    if (!(e < kAttnTols[t])) ok = false;
  }
  return json{{"B", p.s.B}, {"T", p.s.Tq}, {"max_rel", err}, {"tol", tol}};
}

bool is_refusal(const std::string& msg) {
  return msg.rfind("train.cuda_attention", 0) == 0 && msg.find("must be") != std::string::npos;
}

}  // namespace

namespace {

// Every variant the section times, in its order.
std::vector<AttnVariant> attention_variants() {
  // The fa2 forward at each tile shape with one head a block, then with
  // heads of one KV group packed (attention_heads_per_block 2, 4: the tile's
  // query rows split among them; refused, so skipped, where the count does
  // not divide H / Hkv).
  using wiola::AttentionBwd, wiola::AttentionFwd, wiola::AttentionTile, wiola::HeadsPerBlock;
  const AttentionTile tiles[] = {AttentionTile::T64x64, AttentionTile::T64x128, AttentionTile::T128x64,
                                 AttentionTile::T128x128};
  // "fwd fa2", "fwd fa2 64x128", ...: the default tile unnamed.
  auto fa2_name = [](const char* dir, AttentionTile t) {
    return std::string(dir) + " fa2" + (t == AttentionTile::T64x64 ? "" : " " + std::string(wiola::to_string(t)));
  };
  std::vector<AttnVariant> v = {{"fwd tc", false, AttentionFwd::Tc, AttentionBwd::V1, {}, {}, {}}};
  for (AttentionTile t : tiles)
    v.push_back({fa2_name("fwd", t), false, AttentionFwd::Fa2, AttentionBwd::V1, t, {}, HeadsPerBlock::One});
  for (AttentionTile t : tiles)
    for (HeadsPerBlock hp : {HeadsPerBlock::Two, HeadsPerBlock::Four})
      v.push_back({fa2_name("fwd", t) + " hp" + std::string(wiola::to_string(hp)),
                   false,
                   AttentionFwd::Fa2,
                   AttentionBwd::V1,
                   t,
                   {},
                   hp});
  v.push_back({"fwd rows", false, AttentionFwd::Rows, AttentionBwd::V1, {}, {}, {}});
  v.push_back({"bwd v1", true, AttentionFwd::Tc, AttentionBwd::V1, {}, {}, {}});
  v.push_back({"bwd v2", true, AttentionFwd::Tc, AttentionBwd::V2, {}, {}, {}});
  for (AttentionTile t : tiles) v.push_back({fa2_name("bwd", t), true, AttentionFwd::Tc, AttentionBwd::Fa2, {}, t, {}});
  v.push_back({"bwd rows", true, AttentionFwd::Rows, AttentionBwd::V1, {}, {}, {}});
  return v;
}

}  // namespace

namespace {

// The documents row (issue 46): forward + backward of the plain causal layer
// at the step's shape with the run's options, over B windows of T as one
// causal document each and over the same windows holding packed documents
// of mean length 256 (bench/document_layout.h: the layout of the CPU's
// BM_attention_documents; --small's T = 64 takes T / 4), after a check of the
// documents against the CPU at the check shape. The kernels skip the key
// tiles before a query tile's first document and the query tiles after a
// key tile's last, so the GPU's expected ratio is that of the 64 x 64 (query
// tile, key tile) pairs visited (attention_tiles_visited), printed beside
// the measured one: at T = 2048 and B = 4 (wiola-360m's step: 33 documents)
// 2,112 causal pairs against 729, 0.345 (docs/gpu.md "Packed documents");
// fixed costs per block (Q and output rows, lse, D) make the time's ratio
// somewhat higher.
constexpr int kDocMeanLen = 256;

// The documents' outputs (o, lse, dq, dk, dv) on the small problem against
// the CPU; false where one is out of its bound.
json check_documents(Ops<float>& g, AttnProblem& p, bool& ok) {
  const std::vector<Vec> ref = cpu_reference(g, p);
  p.fwd(g);
  p.bwd(g);
  const std::vector<Vec> got{download_bf16(g, p.o.data(), p.nq), download_vec(g, p.lse.data(), p.nl),
                             download_bf16(g, p.dq.data(), p.nq), download_bf16(g, p.dk.data(), p.nk),
                             download_bf16(g, p.dv.data(), p.nk)};
  json err = json::object(), tol = json::object();
  ok = true;
  for (size_t t = 0; t < got.size(); ++t) {
    const double e = rel(ref[t], got[t]);
    err[kAttnNames[t]] = e;
    tol[kAttnNames[t]] = kAttnTols[t];
    if (!(e < kAttnTols[t])) ok = false;
  }
  return json{{"B", p.s.B}, {"T", p.s.Tq}, {"max_rel", err}, {"tol", tol}};
}

void run_attention_documents(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  const int mean = std::min(kDocMeanLen, std::max(2, sh.T / 4));
  json j{{"section", "attention documents"},
         {"name", "attention documents"},
         {"dir", "fwd+bwd"},
         {"layer", "causal"},
         {"options", wiola::backend_option_fields(o.backend)},
         {"B", sh.B},
         {"T", sh.T},
         {"H", sh.cfg.H},
         {"Hkv", sh.cfg.Hkv},
         {"dh", sh.dh()},
         {"mean_doc_len", mean}};
  std::string line;
  try {
    bool ok = false;
    auto small = make_attn(g, sh, sh.check_B, sh.check_T, false, 500, std::min(mean, std::max(2, sh.check_T / 4)));
    j["check"] = check_documents(g, *small, ok);
    j["ok"] = ok;
    if (ok) {
      auto causal = make_attn(g, sh, sh.B, sh.T, false, 600), docs = make_attn(g, sh, sh.B, sh.T, false, 600, mean);
      const Timing tc = time_op(g, o, [&] {
        causal->fwd(g);
        causal->bwd(g);
      });
      const Timing td = time_op(g, o, [&] {
        docs->fwd(g);
        docs->bwd(g);
      });
      put_timing(j, td);
      const long tiles_c = wiola::bench::attention_tiles_visited(sh.B, sh.T, nullptr);
      const long tiles_d = wiola::bench::attention_tiles_visited(sh.B, sh.T, docs->hdoc.data());
      long n_docs = 0;
      for (size_t t = 0; t < docs->hdoc.size(); ++t) n_docs += docs->hdoc[t] == int32_t(t % size_t(sh.T));
      j["documents"] = n_docs;
      j["causal_ms"] = tc.ms;
      j["documents_ms"] = td.ms;
      j["ratio"] = td.ms / tc.ms;
      j["tiles_causal"] = tiles_c;
      j["tiles_documents"] = tiles_d;
      j["expected_ratio"] = double(tiles_d) / double(tiles_c);
      char buf[256];
      std::snprintf(buf, sizeof buf, "causal %8.3f ms, %ld documents %8.3f ms: ratio %.3f (64x64 tiles: %.3f)", tc.ms,
                    n_docs, td.ms, td.ms / tc.ms, double(tiles_d) / double(tiles_c));
      line = buf;
    } else {
      line = "FAILED its check (not timed): " + j["check"]["max_rel"].dump();
    }
  } catch (const std::exception& e) {
    line = put_error(g, j, e);
  }
  rep.emit(j);
  std::printf("attention documents fwd+bwd (mean %d) B=%d T=%d H=%d Hkv=%d dh=%d: %s\n", mean, sh.B, sh.T, sh.cfg.H,
              sh.cfg.Hkv, sh.dh(), line.c_str());
}

}  // namespace

void run_attention(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  const std::vector<AttnVariant> variants = attention_variants();
  const wiola::BackendOptions& base = o.backend;
  for (bool atm : {false, true}) {
    const char* layer = atm ? "atm" : "causal";
    auto small = make_attn(g, sh, sh.check_B, sh.check_T, atm, atm ? 200 : 100);
    const std::vector<Vec> ref = cpu_reference(g, *small);
    auto big = make_attn(g, sh, sh.B, sh.T, atm, atm ? 400 : 300);
    const double f_fwd = attn_fwd_flops(big->s);
    for (const AttnVariant& var : variants) {
      json j{{"section", "attention"},
             {"name", "attention " + var.name + " " + layer},
             {"dir", var.bwd ? "bwd" : "fwd"},
             {"variant", var.name.substr(4)},
             {"layer", layer},
             {"options", wiola::backend_option_fields(var.all(base))},
             {"B", big->s.B},
             {"T", big->s.Tq},
             {"H", big->s.H},
             {"Hkv", big->s.Hkv},
             {"dh", big->s.dh},
             {"flop_rule", kAttnFlopRule}};
      if (atm)
        j["atm"] = {{"tau", big->tau},
                    {"merged_pair_frac", big->merged_pairs},
                    {"keys_frac", big->keys_frac},
                    {"check_merged_pair_frac", small->merged_pairs}};
      std::string line;
      try {
        bool ok = false;
        j["check"] = check_variant(g, base, *small, ref, var, ok);
        j["ok"] = ok;
        if (ok) {
          // Its forward once (a backward reads o and lse), then the timed op.
          {
            OptionsScope e(g, base, var.fwd(base));
            big->fwd(g);
          }
          OptionsScope e(g, base, var.all(base));
          const Timing t = time_op(g, o, [&] { var.bwd ? big->bwd(g) : big->fwd(g); });
          put_timing(j, t);
          const double flops = var.bwd ? 2.5 * f_fwd : f_fwd;
          j["flops"] = flops;
          j["tflops"] = flops / (t.ms * 1e-3) / 1e12;
          char buf[256];
          std::snprintf(buf, sizeof buf, "%8.3f ms  %7.1f TFLOP/s", t.ms, j["tflops"].get<double>());
          line = buf;
        } else {
          line = "FAILED its check (not timed): " + j["check"]["max_rel"].dump();
        }
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        g.synchronize();
        if (is_refusal(msg)) {
          j["skipped"] = true;
          j["ok"] = false;
          j["message"] = msg;
          line = "skipped: " + msg;
        } else {
          j["ok"] = false;
          j["error"] = msg;
          line = "ERROR: " + msg;
        }
      }
      rep.emit(j);
      std::printf("attention %-19s %-6s B=%d T=%d H=%d Hkv=%d dh=%d: %s\n", var.name.c_str(), layer, big->s.B,
                  big->s.Tq, big->s.H, big->s.Hkv, big->s.dh, line.c_str());
    }
  }
  run_attention_documents(g, sh, o, rep);
}

}  // namespace kernel_bench
