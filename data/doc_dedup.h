// Exact-duplicate documents for `wiola prep --dedup`: a set of the XXH3-128
// hashes of documents' UTF-8 bytes. The first occurrence of a text is kept,
// every later one dropped. Memory grows per distinct document, not per token:
// an open-addressing table of 16-byte slots, doubled when 3/4 full, so 21 to
// 43 bytes per distinct document (e.g. 100 M documents: 2.1 to 4.3 GB).
// 128 bits make a false "duplicate" (two different texts, one hash) about
// n²/2^129: 1e-23 at n = 1e8.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace wiola {

class DocDedup {
 public:
  DocDedup();
  // Records `text`; false when the same text was recorded before.
  bool insert(std::string_view text);
  uint64_t size() const { return used_; }
  uint64_t memory_bytes() const { return slots_.size() * sizeof(Slot); }

 private:
  struct Slot {
    uint64_t lo = 0, hi = 0;  // (0, 0): empty
  };
  bool insert_hash(Slot h);
  void grow();

  std::vector<Slot> slots_;  // a power of two
  uint64_t used_ = 0;
};

}  // namespace wiola
