#include "infer/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace wiola::infer {

double EvalTotals::perplexity() const { return std::exp(mean()); }

double cross_entropy_sum(const float* logits, const int32_t* targets, int n, int V) {
  double sum = 0;
  for (int t = 0; t < n; ++t) {
    const float* row = logits + size_t(t) * V;
    const double mx = double(*std::max_element(row, row + V));
    double se = 0;
    for (int v = 0; v < V; ++v) se += std::exp(double(row[v]) - mx);
    sum += mx + std::log(se) - double(row[targets[t]]);
  }
  return sum;
}

namespace {
// A batch of full windows: the model's loss, exactly as training computes it
// (with documents its EOS targets masked: counted_targets of them count).
double full_batch_loss(Model<float>& model, const std::vector<int32_t>& tokens) {
  return model.eval_loss(tokens.data());
}

// The cross-entropy of a window's first n targets that count: with documents
// (eos >= 0) not those whose input is the EOS id (docs/model.md §2).
double counted_sum(const float* logits, const int32_t* window, int n, int V, int32_t eos, int64_t* targets) {
  if (eos < 0) {
    *targets += n;
    return cross_entropy_sum(logits, window + 1, n, V);
  }
  double sum = 0;
  for (int t = 0; t < n; ++t)
    if (window[t] != eos) {
      sum += cross_entropy_sum(logits + size_t(t) * V, window + t + 1, 1, V);
      ++*targets;
    }
  return sum;
}

// A batch whose windows may be short (lens[b] ids, 0 for an unused row):
// inputs padded with the window's last id (causal: no effect on earlier
// positions), cross-entropy of the real targets only.
double partial_batch_loss(Model<float>& model, const std::vector<int32_t>& tokens, const std::vector<int>& lens,
                          int64_t* targets) {
  const int B = int(lens.size()), T = model.config().T, V = model.config().V;
  std::vector<int32_t> in(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    const int32_t* w = tokens.data() + size_t(b) * (T + 1);
    const int n = std::max(lens[size_t(b)], 1);
    for (int t = 0; t < T; ++t) in[size_t(b) * T + size_t(t)] = w[std::min(t, n - 1)];
  }
  const std::vector<float> logits = model.forward_logits(in.data(), false);
  double sum = 0;
  for (int b = 0; b < B; ++b) {
    const int n = lens[size_t(b)] - 1;  // targets of this window
    if (n <= 0) continue;
    sum += counted_sum(logits.data() + size_t(b) * T * V, tokens.data() + size_t(b) * (T + 1), n, V,
                       model.options().documents_eos, targets);
  }
  return sum;
}
}  // namespace

EvalTotals evaluate_windows(Model<float>& model, int64_t count, const WindowSource& window,
                            const EvalProgress& progress) {
  const int B = model.options().micro_batch, T = model.config().T;
  std::vector<int32_t> tokens(size_t(B) * (T + 1));
  std::vector<int> lens(static_cast<size_t>(B));
  EvalTotals tot;
  for (int64_t i0 = 0; i0 < count; i0 += B) {
    const int nb = int(std::min<int64_t>(B, count - i0));
    bool full = nb == B;
    for (int b = 0; b < B; ++b) {
      int32_t* w = tokens.data() + size_t(b) * (T + 1);
      int& n = lens[size_t(b)];
      n = b < nb ? window(i0 + b, w) : 0;
      WIOLA_CHECK(n >= 0 && n <= T + 1, "window ", i0 + b, " has ", n, " ids, not 0..T+1");
      if (n < T + 1) {  // pad a short or unused row with its last id (0 when empty)
        full = false;
        std::fill(w + n, w + T + 1, n > 0 ? w[n - 1] : 0);
      }
    }
    if (full) {
      tot.loss_sum += full_batch_loss(model, tokens);
      tot.targets += counted_targets(tokens.data(), B, T, model.options().documents_eos);
    } else {
      tot.loss_sum += partial_batch_loss(model, tokens, lens, &tot.targets);
    }
    tot.windows += nb;
    if (progress) progress(tot);
  }
  return tot;
}

namespace {
template <class V>
void write_npy_impl(const std::string& path, const V* data, const std::vector<int64_t>& shape, const char* descr) {
  std::string dims;
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += (i ? ", " : "") + std::to_string(shape[i]);
    n *= shape[i];
  }
  if (shape.size() == 1) dims += ",";  // a 1-tuple
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header, padded to 64 with '\n' last.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    WIOLA_CHECK(f, tmp, ": cannot be written");
    const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(magic, 8);
    const uint16_t hl = uint16_t(header.size());
    const char len[2] = {char(hl & 0xff), char(hl >> 8)};
    f.write(len, 2);
    f.write(header.data(), std::streamsize(header.size()));
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size_t(n) * sizeof(V)));
    WIOLA_CHECK(f.good(), tmp, ": write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  WIOLA_CHECK(!ec, path, ": cannot rename into place: ", ec.message());
}
}  // namespace

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy_impl(path, data, shape, "<f4");
}
void write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  write_npy_impl(path, data, shape, "<i4");
}

}  // namespace wiola::infer
