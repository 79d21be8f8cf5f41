// ATM (docs/model.md §2 and the paper's Algorithm 1), host side: the merge
// map for tests, statistics and dumps. Training decides on the backend
// (Ops::atm_plan); both run the same code (kernels/atm_plan.h), so the
// decisions agree. Decisions are constants for the backward pass. Queries are
// never merged: keys and values are (docs/model.md §2), which the attention
// op handles through AttnKeys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace wiola {

// Algorithm 1, greedy left to right: pair (t, t+1) merges when rho[t] > tau
// (strictly) and t is not already taken. rho[T-1]. Returns open[T]: 1 where t
// opens a merged pair (t, t+1).
std::vector<uint8_t> atm_greedy_open(const double* rho, int T, double tau);

// The paper's merge map M = {G_k}: groups of one or two source positions.
std::vector<std::vector<int>> atm_merge_map(const uint8_t* open, int T);
// Paper's merge (mean of members) and unmerge (copy group row to members),
// for rows of width w. Used by tests of Algorithm 1 and by the reference.
std::vector<double> atm_merge(const std::vector<std::vector<int>>& groups,
                              const double* x, int w);
std::vector<double> atm_unmerge(const std::vector<std::vector<int>>& groups,
                                const double* xm, int T, int w);

// Key layout for the attention op, for a batch of B sequences of length T.
struct AtmLayout {
  int B = 0, T = 0;
  std::vector<uint8_t> open;         // [B, T]
  std::vector<int32_t> group_first;  // [B, T] first member of group j
  std::vector<int32_t> key_end;      // [B, T] last member of group j
  std::vector<int32_t> n_groups;     // [B]
  // Statistics for reporting: mu = 1 - T'/T, visible (query, key) pairs.
  int64_t total_groups() const;
  int64_t visible_pairs() const;     // vs B*T(T+1)/2 for plain causal
};
AtmLayout atm_layout(std::vector<uint8_t> open, int B, int T);

}  // namespace wiola
