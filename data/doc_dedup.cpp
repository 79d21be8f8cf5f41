#include "data/doc_dedup.h"

#include <xxhash.h>

namespace wiola {

DocDedup::DocDedup() : slots_(size_t(1) << 16) {}

bool DocDedup::insert(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  Slot s{h.low64, h.high64};
  if (s.lo == 0 && s.hi == 0) s.lo = 1;  // (0, 0) marks an empty slot
  if (4 * (used_ + 1) > 3 * slots_.size()) grow();
  return insert_hash(s);
}

bool DocDedup::insert_hash(Slot h) {
  const size_t mask = slots_.size() - 1;
  for (size_t i = size_t(h.lo) & mask;; i = (i + 1) & mask) {  // linear probing
    Slot& s = slots_[i];
    if (s.lo == h.lo && s.hi == h.hi) return false;
    if (s.lo == 0 && s.hi == 0) {
      s = h;
      ++used_;
      return true;
    }
  }
}

void DocDedup::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  used_ = 0;
  for (const Slot& s : old)
    if (s.lo != 0 || s.hi != 0) insert_hash(s);
}

}  // namespace wiola
