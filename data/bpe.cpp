#include "data/bpe.h"

#include <queue>

#include "data/byte_level.h"
#include "util/error.h"

namespace wiola {

BpeModel::BpeModel(TokenIndex vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   bool ignore_merges, const std::string& origin)
    : vocab_(std::move(vocab)), num_merges_(merges.size()), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_char(uint8_t(b)));
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  size_t cap = 1;
  while (cap < merges.size() * 2 + 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  vals_.assign(cap, MergeValue{});
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), in = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end())
      fail(origin, ": merge #", r, " (\"", a, "\" \"", b, "\") uses a token that is not in model.vocab");
    if (in == vocab_.end())
      fail(origin, ": merge #", r, " (\"", a, "\" \"", b, "\") makes \"", a + b, "\", which is not in model.vocab");
    uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
    size_t mask = cap - 1;
    size_t h = size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
    while (keys_[h] != kEmpty && keys_[h] != key) h = (h + 1) & mask;
    keys_[h] = key;  // a repeated pair takes the later rank, as HF's HashMap insert does
    vals_[h] = MergeValue{uint32_t(r), in->second};
  }
}

bool BpeModel::has_all_bytes() const {
  for (int32_t id : byte_id_)
    if (id < 0) return false;
  return true;
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(bytes_to_byte_level(bytes));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Sym {
    int32_t c;
    int32_t prev, next;
    bool alive;
  };
  // Bytes whose character is not in the vocabulary are dropped (HF without unk_token).
  thread_local std::vector<Sym> syms;
  syms.clear();
  for (unsigned char b : bytes) {
    int32_t id = byte_id_[b];
    if (id < 0) continue;
    int32_t i = int32_t(syms.size());
    syms.push_back(Sym{id, i - 1, i + 1, true});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  const int32_t n = int32_t(syms.size());
  if (n == 1) {
    out.push_back(syms[0].c);
    return;
  }
  // HF's heap as is (a linear scan for the min (rank, position) pair would
  // differ from it only through stale entries that happen to stay valid).
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Cand& o) const {  // priority_queue pops the "largest"
      if (rank != o.rank) return rank > o.rank;
      return pos > o.pos;
    }
  };
  thread_local std::priority_queue<Cand> q;  // always drained below
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const MergeValue* m = find_merge(syms[i].c, syms[i + 1].c)) q.push(Cand{m->rank, i, m->new_id});
  while (!q.empty()) {
    Cand top = q.top();
    q.pop();
    Sym& cur = syms[top.pos];
    if (!cur.alive || cur.next == -1) continue;
    int32_t next_pos = cur.next;
    Sym right = syms[next_pos];
    const MergeValue* m = find_merge(cur.c, right.c);
    if (!m || m->new_id != top.new_id) continue;
    cur.c = top.new_id;
    cur.next = right.next;
    syms[next_pos].alive = false;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeValue* pm = find_merge(syms[cur.prev].c, cur.c)) q.push(Cand{pm->rank, cur.prev, pm->new_id});
    }
    if (cur.next >= 0) {
      if (const MergeValue* nm = find_merge(cur.c, syms[cur.next].c)) q.push(Cand{nm->rank, top.pos, nm->new_id});
    }
  }
  for (int32_t i = 0; i != -1; i = syms[i].next) out.push_back(syms[i].c);
}

}  // namespace wiola
