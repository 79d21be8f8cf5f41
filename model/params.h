// Parameter layout: every tensor of docs/model.md §3 as a slice of one flat buffer
// (llm.c style), so gradients, AdamW state and ZeRO shards mirror it. Each
// tensor starts on a multiple of the layout's alignment (kParamAlign); the
// elements between tensors are padding, zero in every buffer of the layout.
// Under TP a process holds a selection of global rows or columns of a tensor;
// the maps here say which, so initialisation and the numerics dump work on
// global element indices and every layout starts from the same model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ptr.h"
#include "model/config.h"

namespace wiola {

enum class InitKind { Normal, Ones, Zeros, Constant };

struct ParamEntry {
  std::string name;            // docs/model.md §3 name
  int64_t rows = 0, cols = 1;  // local shape ([out, in]; vectors: cols = 1)
  int64_t grows = 0, gcols = 1;  // global shape
  std::vector<int32_t> row_map;  // local row -> global row (empty: identity)
  std::vector<int32_t> col_map;  // local col -> global col (empty: identity)
  size_t offset = 0;           // into the flat buffer
  size_t span = 0;             // size() plus the padding after it: the next entry
                               // (or the buffer's end) is at offset + span
  bool follows = false;        // placed right after the previous entry, unaligned
                               // (one GEMM operand with it: wq|wk|wv|wgate, wkc|wvc)
  bool decay = true;           // AdamW weight decay applies
  bool tp_replicated = false;  // identical on every TP rank (count once in norms)
  InitKind init = InitKind::Normal;
  double init_value = 0;       // Constant init
  size_t size() const { return size_t(rows * cols); }
  bool is_matrix() const { return gcols > 1; }
  // Global flat element index of local element (r, c).
  int64_t global_index(int64_t r, int64_t c) const {
    const int64_t gr = row_map.empty() ? r : row_map[size_t(r)];
    const int64_t gc = col_map.empty() ? c : col_map[size_t(c)];
    return gr * gcols + gc;
  }
};

// Where tensors start in the flat buffers, in elements: 128 is 256 bytes of
// the bf16 weight copy and 512 of the fp32 master, gradients and moments, so
// every GEMM operand meets cuBLAS's alignment for its vectorised kernels.
inline constexpr size_t kParamAlign = 128;

class ParamLayout {
 public:
  // align: every entry but those that follow their predecessor starts on a
  // multiple of it (1: the packed layout of checkpoints written before
  // tensors were aligned, kept for tests).
  ParamLayout(const ModelConfig& cfg, const ModelShard& shard, size_t align = kParamAlign);
  // The layout of a rank that holds several layer ranges (the chunks of an
  // interleaved or V pipeline schedule; ParamStore in model/model.h): the
  // embedding once if a range starts or ends the model, every range's
  // layers in layer order, the final norm if one ends it. One range is the
  // constructor above.
  ParamLayout(const ModelConfig& cfg, int tp_rank, int tp_size, LayerRanges ranges,
              size_t align = kParamAlign);
  const std::vector<ParamEntry>& entries() const { return entries_; }
  // Length of the flat buffers: parameters plus padding.
  size_t total() const { return total_; }
  // Parameters only (the sum of entry sizes; total() less the padding).
  size_t n_elements() const { return elements_; }
  size_t alignment() const { return align_; }
  // The padding: [offset, offset + size) ranges between entries, in order.
  struct Range {
    size_t offset = 0, size = 0;
  };
  std::vector<Range> padding() const;
  const ParamEntry& find(const std::string& name) const;  // throws if absent
  const ParamEntry* try_find(const std::string& name) const;

 private:
  // Appends an entry at the next aligned offset, or right after the previous
  // one when e.follows.
  void add(ParamEntry e);
  size_t align_ = kParamAlign;
  std::vector<ParamEntry> entries_;
  size_t total_ = 0, elements_ = 0;
};

// docs/model.md §3 names.
std::string layer_param_name(int layer, const char* suffix);

// Views into flat buffers of the layout (parameters, gradients, the weight
// copy), as typed backend pointers.
struct LayerParams {
  Ptr ln1_g, ln1_d;                 // input_layernorm [d]
  Ptr wq, wk, wv, wkc, wvc;         // [H dh, d], [Hkv dh, d] x4
  Ptr wgate, wo, phi;               // [H dh, d], [d, H dh], [1]
  Ptr wqkvg;                        // wq, wk, wv, wgate as one [2 H dh + 2 Hkv dh, d] (adjacent)
  Ptr wkvc;                         // wkc, wvc as one [2 Hkv dh, d] (adjacent)
  Ptr ln2_g, ln2_d;                 // post_attention_layernorm [d]
  Ptr ga, ua, da;                   // [dA, d], [dA, d], [d, dA]
  Ptr ub, db, wf;                   // [dB, d], [d, dB], [d, 2d]
};

struct ModelParams {
  Ptr embed;                        // [V_local, d] (first or last stage)
  Ptr norm_g, norm_d;               // final norm (last stage)
  std::vector<LayerParams> layers;  // index l - layer_begin
  // Every tensor at base + its offset.
  static ModelParams bind(const ParamLayout& layout, Ptr base, const ModelConfig& cfg,
                          const ModelShard& shard);
  // What the forward and backward read: matrices (and the embedding) from
  // the weight copy, vectors (γ, δ, φ) from the master parameters. With no
  // separate copy both bases are the master.
  static ModelParams bind_forward(const ParamLayout& layout, Ptr weights, Ptr master,
                                  const ModelConfig& cfg, const ModelShard& shard);
};

// Counter-based initial values: element value depends only on (seed, tensor
// name, global element index). Writes host memory `out` (layout.total()),
// padding included (zero).
template <class T>
void init_params_host(const ParamLayout& layout, uint64_t seed, T* out);

// Standard normal from (seed, name, index): splitmix64 counters + Box-Muller.
double counter_normal(uint64_t seed, const std::string& name, uint64_t index);
// The same in two steps: a tensor's key (its name hashed once), then each draw.
uint64_t counter_key(uint64_t seed, const std::string& name);
double counter_normal(uint64_t key, uint64_t index);

}  // namespace wiola
