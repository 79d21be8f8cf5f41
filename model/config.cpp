#include "model/config.h"

#include <algorithm>

#include "util/error.h"

namespace wiola {

void ModelConfig::validate() const {
  auto pos = [&](int v, const char* k) {
    WIOLA_CHECK(v > 0, "model.", k, " must be positive (got ", v, ")");
  };
  pos(d, "d"); pos(L, "n_layers"); pos(H, "n_heads"); pos(Hkv, "n_kv_heads");
  pos(dA, "d_a"); pos(dB, "d_b"); pos(V, "vocab_size"); pos(T, "seq_len");
  pos(Lambda, "lookback");
  WIOLA_CHECK(d % H == 0, "model.d (", d, ") must be divisible by model.n_heads (", H, ")");
  WIOLA_CHECK(H % Hkv == 0, "model.n_heads (", H, ") must be divisible by model.n_kv_heads (", Hkv, ")");
  WIOLA_CHECK(dh() % 2 == 0, "head dim d/n_heads = ", dh(), " must be even (SRPE rotates pairs)");
  WIOLA_CHECK(T >= 2, "model.seq_len must be at least 2 (got ", T, ")");
  WIOLA_CHECK(V >= 2, "model.vocab_size must be at least 2 (got ", V, ")");
  WIOLA_CHECK(eps > 0, "model.rms_eps must be positive");
  WIOLA_CHECK(theta0 > 1, "model.srpe_theta must be > 1");
  WIOLA_CHECK(k_s > 0, "model.srpe_spiral_divisor must be positive");
  WIOLA_CHECK(init_std > 0, "model.init_std must be positive");
}

int64_t ModelConfig::param_count() const {
  const int64_t d_ = d, hd = int64_t(H) * dh(), kvd = int64_t(Hkv) * dh();
  const int64_t per_layer = 2 * d_ * hd + hd * d_ + 4 * d_ * kvd + 3 * d_ * dA +
                            2 * d_ * dB + 2 * d_ * d_ + 4 * d_ + 1;
  return L * per_layer + int64_t(V) * d_ + 2 * d_;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  c.name = name;
  auto set = [&](int d, int L, int H, int Hkv, int dA, int dB, int V, int T) {
    c.d = d; c.L = L; c.H = H; c.Hkv = Hkv; c.dA = dA; c.dB = dB; c.V = V; c.T = T;
  };
  if (name == "wiola-120m") set(768, 12, 12, 4, 768, 3072, 32000, 2048);
  else if (name == "wiola-360m") set(1024, 16, 16, 4, 1024, 4096, 32000, 2048);
  else if (name == "wiola-700m") set(1536, 24, 16, 8, 1536, 6144, 32000, 2048);
  else if (name == "wiola-1.5b") set(2048, 28, 16, 8, 2048, 8192, 32000, 2048);
  // Test and CPU sizes (the project's own; L >= 3 so ATM has a layer).
  else if (name == "wiola-tiny") set(64, 6, 4, 2, 64, 256, 512, 32);
  else if (name == "wiola-small") set(128, 6, 4, 2, 128, 512, 32000, 128);
  else if (name == "wiola-bench") set(256, 8, 8, 4, 256, 1024, 8192, 256);
  else
    fail("unknown model preset '", name, "' (known: wiola-120m, wiola-360m, "
         "wiola-700m, wiola-1.5b, wiola-tiny, wiola-small, wiola-bench)");
  return c;
}

std::vector<std::string> model_preset_names() {
  return {"wiola-120m", "wiola-360m", "wiola-700m", "wiola-1.5b",
          "wiola-tiny", "wiola-small", "wiola-bench"};
}

int boundary_tensors_in(const ModelConfig& c, const ModelShard& s) {
  return s.first_stage() ? 0 : 1 + (s.layer_begin - std::max(0, s.layer_begin + 1 - c.Lambda));
}

int boundary_tensors_out(const ModelConfig& c, const ModelShard& s) {
  const int l1 = s.end(c);
  return s.last_stage(c) ? 0 : 1 + (l1 - std::max(0, l1 + 1 - c.Lambda));
}

LocalDims::LocalDims(const ModelConfig& c, const ModelShard& s) {
  const int tp = s.tp_size;
  WIOLA_CHECK(c.Hkv % tp == 0, "parallel.tp (", tp, ") must divide model.n_kv_heads (", c.Hkv, ")");
  WIOLA_CHECK(c.dA % tp == 0 && c.dB % tp == 0, "parallel.tp (", tp, ") must divide model.d_a and model.d_b");
  WIOLA_CHECK(c.V % tp == 0, "parallel.tp (", tp, ") must divide model.vocab_size (", c.V, ")");
  H = c.H / tp; Hkv = c.Hkv / tp; dh = c.dh();
  dA = c.dA / tp; dB = c.dB / tp;
  V = c.V / tp; v0 = s.tp_rank * V;
}

}  // namespace wiola
