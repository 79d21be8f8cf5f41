#include "model/atm.h"

#include "kernels/atm_plan.h"

namespace wiola {

std::vector<uint8_t> atm_greedy_open(const double* rho, int T, double tau) {
  std::vector<uint8_t> open(size_t(T), 0);
  atm_greedy_row(rho, T, tau, open.data());
  return open;
}

std::vector<std::vector<int>> atm_merge_map(const uint8_t* open, int T) {
  std::vector<std::vector<int>> groups;
  for (int t = 0; t < T;) {
    if (open[t] && t + 1 < T) {
      groups.push_back({t, t + 1});
      t += 2;
    } else {
      groups.push_back({t});
      t += 1;
    }
  }
  return groups;
}

std::vector<double> atm_merge(const std::vector<std::vector<int>>& groups,
                              const double* x, int w) {
  std::vector<double> out(groups.size() * size_t(w), 0.0);
  for (size_t k = 0; k < groups.size(); ++k) {
    for (int t : groups[k])
      for (int i = 0; i < w; ++i) out[k * w + i] += x[size_t(t) * w + i];
    for (int i = 0; i < w; ++i) out[k * w + i] /= double(groups[k].size());
  }
  return out;
}

std::vector<double> atm_unmerge(const std::vector<std::vector<int>>& groups,
                                const double* xm, int T, int w) {
  std::vector<double> out(size_t(T) * w, 0.0);
  for (size_t k = 0; k < groups.size(); ++k)
    for (int t : groups[k])
      for (int i = 0; i < w; ++i) out[size_t(t) * w + i] = xm[k * w + i];
  return out;
}

AtmLayout atm_layout(std::vector<uint8_t> open, int B, int T) {
  AtmLayout a;
  a.B = B; a.T = T;
  a.open = std::move(open);
  a.group_first.assign(size_t(B) * T, 0);
  a.key_end.assign(size_t(B) * T, 0);
  a.n_groups.assign(size_t(B), 0);
  for (int b = 0; b < B; ++b)
    a.n_groups[size_t(b)] = atm_layout_row(a.open.data() + size_t(b) * T, T,
                                           a.group_first.data() + size_t(b) * T,
                                           a.key_end.data() + size_t(b) * T);
  return a;
}

int64_t AtmLayout::total_groups() const {
  int64_t n = 0;
  for (int32_t g : n_groups) n += g;
  return n;
}

int64_t AtmLayout::visible_pairs() const {
  int64_t pairs = 0;
  for (int b = 0; b < B; ++b) {
    int visible = 0;  // groups with key_end <= t, advanced as t grows
    for (int t = 0; t < T; ++t) {
      while (visible < n_groups[size_t(b)] && key_end[size_t(b) * T + visible] <= t) ++visible;
      pairs += visible + (open[size_t(b) * T + t] ? 1 : 0);
    }
  }
  return pairs;
}

}  // namespace wiola
