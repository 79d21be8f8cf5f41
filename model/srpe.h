// SRPE table (docs/model.md §2): angles and the radial factor are computed in float64
// from the integer position and rounded once to the model's type; backends
// only apply the rotation (Ops::srpe_apply).
#pragma once

#include <vector>

#include "model/config.h"

namespace wiola {

// table[npos, dh/2, 2] = (c, s) for positions pos0 .. pos0+npos-1:
// w_j = theta0^(-2j/dh), Theta = p w_j (1 + 1/k_s), r = 1 + a_s sin(p f_s w_j),
// c = r cos Theta, s = r sin Theta.
template <class T>
std::vector<T> srpe_table(const ModelConfig& cfg, int pos0, int npos);

}  // namespace wiola
