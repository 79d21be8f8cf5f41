#include "train/stage_schedule.h"

#include <algorithm>

namespace wiola {

StageSchedule make_stage_schedule(dist::Schedule name, int pp, int stage, int m, int v,
                                  dist::ChunkPlacement placement) {
  StageSchedule s;
  s.pp = pp;
  s.stage = stage;
  s.m = m;
  s.v = v;
  s.placement = placement;
  using dist::Schedule;
  s.actions = name == Schedule::GPipe         ? dist::schedule_gpipe(pp, stage, m)
              : name == Schedule::ZbH1        ? dist::schedule_zb_h1(pp, stage, m)
              : name == Schedule::Interleaved ? dist::schedule_interleaved(pp, stage, m, v)
              : name == Schedule::ZbV         ? dist::schedule_zb_v(pp, stage, m)
                                              : dist::schedule_1f1b(pp, stage, m);
  // Each chunk's micro-batches go through it in order, so the ones alive
  // (forward to backward) and those waiting between B and W are windows of
  // consecutive micro-batches: slot micro % slots is free when it is reused.
  for (int c = 0; c < v; ++c) {
    const std::vector<dist::Action> mine = dist::chunk_actions(s.actions, c);
    s.chunk_slots.push_back(std::max(1, dist::max_in_flight(mine)));
    s.chunk_weight_slots.push_back(std::max(1, dist::max_pending_weight(mine)));
  }
  s.slots = *std::max_element(s.chunk_slots.begin(), s.chunk_slots.end());
  return s;
}

StageSchedule make_forward_schedule(const StageSchedule& train, int m) {
  StageSchedule s = train;
  s.m = m;
  s.actions.clear();
  for (int i = 0; i < m; ++i)
    for (int c = 0; c < s.v; ++c) s.actions.push_back({dist::Op::Fwd, i, c});
  s.chunk_slots.assign(size_t(s.v), 1);
  s.chunk_weight_slots.assign(size_t(s.v), 1);
  s.slots = 1;
  return s;
}

}  // namespace wiola
