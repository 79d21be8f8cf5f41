#include "model/srpe.h"

#include <cmath>

namespace wiola {

template <class T>
std::vector<T> srpe_table(const ModelConfig& cfg, int pos0, int npos) {
  const int dh = cfg.dh(), half = dh / 2;
  std::vector<T> table(size_t(npos) * half * 2);
  for (int i = 0; i < npos; ++i) {
    const double p = double(pos0 + i);
    for (int j = 0; j < half; ++j) {
      const double w = std::pow(cfg.theta0, -2.0 * j / dh);
      const double theta = p * w * (1.0 + 1.0 / cfg.k_s);
      const double r = 1.0 + cfg.a_s * std::sin(p * cfg.f_s * w);
      table[(size_t(i) * half + j) * 2 + 0] = T(r * std::cos(theta));
      table[(size_t(i) * half + j) * 2 + 1] = T(r * std::sin(theta));
    }
  }
  return table;
}

template std::vector<float> srpe_table<float>(const ModelConfig&, int, int);
template std::vector<double> srpe_table<double>(const ModelConfig&, int, int);

}  // namespace wiola
