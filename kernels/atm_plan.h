// ATM's merge plan for one sequence (docs/model.md §2, the Wiola paper's
// Algorithm 1), written once for the host and for device kernels: the CPU
// backend, a GPU backend (one thread per sequence) and the host-side tests
// and statistics (model/atm.h) all run these two functions, so decisions are
// identical wherever they are made.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace wiola {

// Algorithm 1, greedy left to right: pair (t, t+1) merges when rho[t] > tau
// (strictly) and t is not already taken. rho[T-1]; writes open[T], 1 where t
// opens a merged pair (t, t+1). doc_start[T] (may be null: one document):
// the first position of each position's document; a pair never crosses a
// document's start (docs/model.md §2 "Documents"), so each document is
// planned as if alone.
WIOLA_HD void atm_greedy_row(const double* rho, int T, double tau, uint8_t* open, const int32_t* doc_start = nullptr) {
  for (int t = 0; t < T; ++t) open[t] = 0;
  for (int t = 0; t + 1 < T;) {
    if (rho[t] > tau && !(doc_start && doc_start[t + 1] == t + 1)) {
      open[t] = 1;
      t += 2;  // t+1 is taken
    } else {
      t += 1;
    }
  }
}

// Key layout of one sequence for the attention op: group j covers positions
// group_first[j]..key_end[j] (one or two members). Rows past the group count
// get T in both (never visible). Returns the group count.
WIOLA_HD int atm_layout_row(const uint8_t* open, int T, int32_t* group_first, int32_t* key_end) {
  int j = 0;
  for (int t = 0; t < T; ++j) {
    const bool pair = open[t] && t + 1 < T;
    group_first[j] = t;
    key_end[j] = pair ? t + 1 : t;
    t += pair ? 2 : 1;
  }
  for (int r = j; r < T; ++r) {
    group_first[r] = T;
    key_end[r] = T;
  }
  return j;
}

}  // namespace wiola
