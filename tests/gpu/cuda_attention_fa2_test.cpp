// The CUDA backend's FlashAttention-2 kernels (kernels/cuda/attention_fa2_{fwd,bwd}.cu,
// backend options attention = fa2, attention_bwd = fa2, their tile shapes and
// head packing) against the CPU backend and against each other, bit for bit
// where the sums run in the same order.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "util/error.h"
#include "tests/gpu/cuda_test_util.h"

#ifdef WIOLA_CUDA_EMU
#include "tools/cuda_emu/emu_sanitizer.h"
#include "tools/cuda_emu/launch_record.h"
#endif

namespace wiola {
namespace {

using namespace cuda_test;

// The FlashAttention-2 form of the bf16 forward (kernels/cuda/attention_fa2_fwd.cu,
// backend option attention = fa2) beside the tensor-core forward, against the CPU on
// exactly the GPU's bf16 inputs, at every head dim it takes, with 4 query heads
// on 2 KV groups: T = 67 (a full 64-row tile and a partial one) and a longer
// T (several key tiles: the running max moves from tile to tile and O is
// rescaled), plain causal and ATM keys with self-open raw keys, each followed
// by the tensor-core backward on fa2's o and lse; and a decoding shape (67
// queries from a position off the tiles over the longer T's keys, forward
// only: the tensor-core backward takes q_pos0 = 0). The cases with a backward run again with
// attention_bwd = fa2 (attention_fa2_bwd.cu), twice, the two
// runs bit-identical. Every case runs the forward again at each other tile
// shape (attention_tile 64x128, 128x64, 128x128), each against the CPU; 128
// query rows a block give the bits of 64 at the same key tile (a warp's 16
// rows see the same key tiles; the extra ones are wholly masked for them:
// p = 0, alpha = 1). The cases with a backward also run the fa2 backward at
// each other tile shape (attention_bwd_tile 64x128, 128x64, 128x128: 128 key
// rows a dK/dV block, 128 query rows a dQ block), each against the CPU and
// bit for bit the default's gradients (a warp's 16 rows meet the same tiles
// as in a 64-row block, the extra ones wholly invisible to them: P = 0); on
// the emulator one of the three a case, in turn. Bounds those of
// AttentionTensorCoresBf16.
//
// The shapes and the kernels' paths they reach (the kernels mask element by
// element: a path is a loop count or a branch):
// - T = 67, every head dim: the forward (k_attention_fwd_fa2) and dQ kernel at
//   64 rows over 64-key tiles meet two query blocks and two key tiles: the
//   next tile's copies issued while one is computed (t + 1 < n_tiles), a key
//   tile with no key hidden from the block's first query (no mask) and a
//   masked diagonal one, a partial query block and key tile. dK/dV at 64 key
//   rows: items of two heads (the next item's copies in flight), a query tile
//   past the block (no mask); with ATM (one pair merged in four: 50 or 51 keys) a
//   key block that no query sees (past the merged keys: no item). At 128
//   rows or keys a block T = 67 is one block and one tile, all masked.
// - T = 130 on the emulator (at d_h = 64; 200 on the GPU, every head dim):
//   at every tile shape a second 128-row block or 128-key tile: its copies in
//   flight, a whole 128-key tile before the diagonal (no mask), a dK/dV block
//   of 128 keys with a query tile past it, a 2-row partial block; the running
//   max moving between 64-key tiles that one 128-key tile takes at once.
// - Decoding, 67 queries from position T - 67 over T keys (q_pos0 off the
//   64-row grid): every query block's visibility shifted, forward only.
// - Packed documents (test_documents: starts inside a tile and on its
//   boundaries, EOS-only documents, one across the boundary at 128), plain
//   and ATM (no pair merged across a start), at T = 67 and the longer T (on
//   the emulator at d_h = 64 only, so the four cases meet the three other
//   backward tile shapes in turn): forward and dQ blocks whose key loop
//   starts past tile 0 (j_base), dK/dV blocks whose query items end before
//   the last tile (doc_query_end), tiles masked by the document alone, and
//   at every tile shape the bits of 64x64 (the extra tiles a 128-row block
//   meets are wholly invisible to the rows they add).
TEST(CudaOps, AttentionFa2Bf16) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  auto cpu = make_backend<float>("cpu");
  struct Case {
    int Tq, Tk, q_pos0;
  };
  int bwd_case = 0;  // the cases with a backward so far
  for (int dh : {32, 64, 96, 128})
#ifdef WIOLA_CUDA_EMU
    // On the emulator (three runs in CI: emu, rev, asan) the longer and
    // decoding shapes at d_h = 64 only, at T = 130; every head dim still runs
    // T = 67 (two tiles, odd T). The GPU runs them all, at T = 200.
    for (const Case shape : {Case{67, 67, 0}, Case{130, 130, 0}, Case{67, 130, 63}}) {
      if (dh != 64 && shape.Tk != 67) continue;
#else
    for (const Case shape : {Case{67, 67, 0}, Case{200, 200, 0}, Case{67, 200, 133}}) {
#endif
      AttnShape s;
      s.B = 2;
      s.Tq = shape.Tq;
      s.Tk = shape.Tk;
      s.q_pos0 = shape.q_pos0;
      s.H = 4;
      s.Hkv = 2;
      s.dh = dh;
      const bool decoding = shape.q_pos0 != 0;
      const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
      const size_t nl = size_t(s.B) * s.H * s.Tq;
      DynBuffer<float> gq(*gpu, DType::BF16, nq), gk(*gpu, DType::BF16, nk), gv(*gpu, DType::BF16, nk),
          gdo(*gpu, DType::BF16, nq);
      const Vec q = bf16_round_trip(*gpu, randn(nq, 50), gq), k = bf16_round_trip(*gpu, randn(nk, 51), gk),
                v = bf16_round_trip(*gpu, randn(nk, 52), gv), dout = bf16_round_trip(*gpu, randn(nq, 53), gdo);
#ifdef WIOLA_CUDA_EMU
      const int n_variants = decoding ? 1 : dh == 64 ? 4 : 2;
#else
      const int n_variants = decoding ? 1 : 4;
#endif
      for (int variant = 0; variant < n_variants; ++variant) {
        const bool with_atm = variant % 2 == 1, with_docs = variant >= 2;
#ifdef WIOLA_CUDA_EMU
        // Under ASan the long shape with ATM and documents only: every mask
        // path of it, each variant already at T = 67.
        if (wiola_emu::under_address_sanitizer() && shape.Tk == 130 && !decoding && variant != 3) continue;
#endif
        const std::vector<int32_t> docs = with_docs ? test_documents(s.B, s.Tq) : std::vector<int32_t>{};
        std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
        for (int b = 0; b < s.B; ++b)
          for (int t = 1 + b; t + 1 < s.Tq; t += 4) open[size_t(b) * s.Tq + t] = 1;
        if (with_docs) no_merge_across(open, docs, s.B, s.Tq);
        const AtmLayout lay = atm_layout(open, s.B, s.Tq);
        GpuAttnCall c(*gpu, s, lay, open, gk.data(), gv.data(), with_atm, docs);
        // o and lse, then (bwd) the tensor-core backward's gradients from them.
        // fwd = false: the backward alone, on the o and lse already there.
        auto run_gpu = [&](bool bwd, bool fwd = true) {
          if (fwd)
            gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data());
          Vec l(nl);
          gpu->download(l.data(), c.glse.data(), c.glse.bytes());
          std::vector<Vec> out{bf16_download(*gpu, c.go.data(), nq), l};
          if (!bwd) return out;
          gpu->attention_bwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data(),
                             gdo.data(), c.gdq.data(), c.gdk.data(), c.gdv.data(), c.draw_k, c.draw_v);
          out.push_back(bf16_download(*gpu, c.gdq.data(), nq));
          out.push_back(bf16_download(*gpu, c.gdk.data(), nk));
          out.push_back(bf16_download(*gpu, c.gdv.data(), nk));
          if (with_atm) {
            out.push_back(bf16_download(*gpu, c.gdrk.data(), nk));
            out.push_back(bf16_download(*gpu, c.gdrv.data(), nk));
          }
          return out;
        };
        set_cuda_backend_options(*gpu, {.attention = AttentionFwd::Fa2});
        const auto fa2 = run_gpu(!decoding);
        // The forward at the other tile shapes: 64x128, 128x64, 128x128.
        const char* const tile_names[] = {"64x128", "128x64", "128x128"};
        const AttentionTile other_tiles[] = {AttentionTile::T64x128, AttentionTile::T128x64, AttentionTile::T128x128};
        std::vector<Vec> tiles[3];
        for (int t = 0; t < 3; ++t) {
          set_cuda_backend_options(*gpu, {.attention = AttentionFwd::Fa2, .attention_tile = other_tiles[t]});
          tiles[t] = run_gpu(false);
        }
        // The fa2 backward (attention_bwd = fa2) on the same o and lse,
        // twice: the two runs must agree bit for bit.
        std::vector<Vec> fa2b, fa2b_again;
        if (!decoding) {
          set_cuda_backend_options(*gpu, {.attention = AttentionFwd::Fa2, .attention_bwd = AttentionBwd::Fa2});
          fa2b = run_gpu(true);
          fa2b_again = run_gpu(true);
        }
        // The fa2 backward at the other tile shapes (attention_bwd_tile), on
        // the same o and lse (the backward alone: o and lse are fa2b's).
        const char* const bwd_tile_names[] = {"64x128", "128x64", "128x128"};
        std::vector<Vec> bwd_tiles[3];
        if (!decoding)
          for (int t = 0; t < 3; ++t) {
#ifdef WIOLA_CUDA_EMU
            // One shape a case in turn (the fa2 backward is the emulator's
            // slowest kernel): 64x128, 128x64, 128x128, 64x128, ... over the
            // fourteen cases, so each 128-row kernel (dK/dV of 128x64 and 128x128,
            // dQ of 64x128 and 128x128) runs at every head dim.
            if (t != bwd_case % 3) continue;
#endif
            set_cuda_backend_options(*gpu, {.attention = AttentionFwd::Fa2,
                                            .attention_bwd = AttentionBwd::Fa2,
                                            .attention_bwd_tile = other_tiles[t]});
            bwd_tiles[t] = run_gpu(true, false);
          }
        if (!decoding) ++bwd_case;
        set_cuda_backend_options(*gpu, {});
        const auto tc = run_gpu(false);

        // The CPU on the same (bf16-valued) inputs (decoding: forward only).
        const std::vector<Vec> ref =
            cpu_attention(*cpu, *gpu, s, AttnInputs{q, k, v, decoding ? Vec{} : dout, open, lay, docs}, c, with_atm);

        const char* names[] = {"o", "lse", "dq", "dk", "dv", "draw_k", "draw_v"};
        const double tols[] = {2e-2, 1e-3, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2};
        std::string name = "dh=" + std::to_string(dh) + " T=" + std::to_string(s.Tq);
        if (decoding) name += " from " + std::to_string(s.q_pos0);
        if (with_atm) name += " ATM";
        if (with_docs) name += " docs";
        // (name, outputs, forward only: o and lse)
        std::vector<std::tuple<std::string, const std::vector<Vec>*, bool>> runs{{"fa2", &fa2, decoding},
                                                                                 {"tc", &tc, true}};
        if (!decoding) runs.emplace_back("fa2 bwd", &fa2b, false);
        if (!decoding)
          for (int t = 0; t < 3; ++t)
            if (!bwd_tiles[t].empty())
              runs.emplace_back(std::string("fa2 bwd ") + bwd_tile_names[t], &bwd_tiles[t], false);
        for (int t = 0; t < 3; ++t) runs.emplace_back(std::string("fa2 ") + tile_names[t], &tiles[t], true);
        for (const auto& [kernel, got, fwd_only] : runs) {
          ASSERT_LE(got->size(), ref.size());
          ASSERT_EQ(got->size(), fwd_only ? size_t(2) : ref.size());
          // (The backward tile shapes ran the backward alone: judged on the gradients.)
          for (size_t t = kernel.rfind("fa2 bwd ", 0) == 0 ? 2 : 0; t < got->size(); ++t) {
            const double e = rel(ref[t], (*got)[t]);
            std::printf("  attention bf16 %-20s %-15s %-7s max rel %.2e (tol %.0e)\n", name.c_str(), kernel.c_str(),
                        names[t], e, tols[t]);
            EXPECT_LT(e, tols[t]) << name << " " << kernel << " " << names[t];
          }
        }
        if (!decoding) {
          // Deterministic: the second run gave the same bits.
          ASSERT_EQ(fa2b_again.size(), fa2b.size());
          for (size_t t = 0; t < fa2b.size(); ++t)
            EXPECT_EQ(0, std::memcmp(fa2b[t].data(), fa2b_again[t].data(), fa2b[t].size() * sizeof(float)))
                << name << " fa2 bwd " << names[t] << ": two runs differ";
          // The fa2 backward ran (the tensor-core backward sums in another
          // order and rounds P and dS elsewhere: some gradient bits differ).
          bool differs = false;
          for (size_t t = 2; t < fa2b.size(); ++t) differs = differs || fa2b[t] != fa2[t];
          EXPECT_TRUE(differs) << name << ": attention_bwd = fa2 gave the tc backward's gradients";
          // Every backward tile shape: the default's bits (so it ran fa2's
          // kernels, not a fallback to the tensor-core backward).
          int bwd_tiles_run = 0;
          for (int t = 0; t < 3; ++t) {
            if (bwd_tiles[t].empty()) continue;  // (on the emulator, another case's)
            ++bwd_tiles_run;
            ASSERT_EQ(bwd_tiles[t].size(), fa2b.size());
            for (size_t u = 0; u < fa2b.size(); ++u)
              EXPECT_EQ(0, std::memcmp(bwd_tiles[t][u].data(), fa2b[u].data(), fa2b[u].size() * sizeof(float)))
                  << name << " fa2 bwd " << bwd_tile_names[t] << " " << names[u] << ": differs from 64x64";
          }
#ifdef WIOLA_CUDA_EMU
          EXPECT_EQ(bwd_tiles_run, 1) << name;
#else
          EXPECT_EQ(bwd_tiles_run, 3) << name;
#endif
        }
        // The fa2 kernel ran (a fallback to the tensor-core kernel would give
        // its outputs bit for bit: fa2 sums in another order, in base 2).
        EXPECT_NE(fa2[1], tc[1]) << name << ": attention = fa2 gave the tc kernel's lse";
        for (int t = 0; t < 3; ++t)
          EXPECT_NE(tiles[t][1], tc[1]) << name << " " << tile_names[t] << ": gave the tc kernel's lse";
        // 128-key tiles ran: at T = 130 or 200 the running max moves between
        // 64-key tiles that one 128-key tile takes at once (one rescale fewer:
        // other bits). (At T = 67 the sums run in the same order: the same bits.)
        // (Not with documents: there each row's keys may lie in one tile either way.)
        if (shape.Tq > 128 && !with_docs) {
          EXPECT_NE(tiles[0][1], fa2[1]) << name << ": attention_tile = 64x128 gave 64x64's lse";
        }
        // 128 query rows a block: the bits of 64 at the same key tile (o, lse).
        using Outs = const std::vector<Vec>*;
        for (auto [t128, t64] : {std::pair<Outs, Outs>{&tiles[1], &fa2}, std::pair<Outs, Outs>{&tiles[2], &tiles[0]}})
          for (size_t t = 0; t < 2; ++t)
            EXPECT_EQ(0, std::memcmp((*t128)[t].data(), (*t64)[t].data(), (*t64)[t].size() * sizeof(float)))
                << name << " " << names[t] << ": 128 query rows a block differ from 64";
      }
    }
#ifdef WIOLA_CUDA_EMU
  // T = 67 at every head dim, T = 130 at d_h 64; causal and ATM; documents at
  // d_h 64 (under ASan T = 130 with ATM and documents only).
  EXPECT_EQ(bwd_case, wiola_emu::under_address_sanitizer() ? 11 : 14);
#else
  EXPECT_EQ(bwd_case, 32);  // T = 67 and 200 at every head dim; causal and ATM, without and with documents
#endif
}

// Head packing in the fa2 forward (backend option attention_heads_per_block
// 2 or 4: query heads of one KV group a block, sharing each K/V tile, the
// tile's query rows split among them) against the CPU on exactly the GPU's
// bf16 inputs, at every head dim it takes, with GQA ratio 4 (8 query heads on
// 2 KV groups: heads g, g + 2, g + 4, g + 6 of group g) and 2 (4 on 2), T = 67
// (odd: partial blocks at 16, 32 and 64 rows a head), plain causal and with
// ATM merges (self-open raw keys), at every tile shape: o and lse within
// AttentionTensorCoresBf16's bounds and bit for bit the unpacked forward's at
// the same key tile (a warp's rows meet the same key tiles or fewer, the
// others wholly masked for it). Since those bits cannot tell a packed launch
// from an unpacked one, on the emulator each packed forward's launch is read
// back (tools/cuda_emu/launch_record.h): H / HP blocks of heads, rows / HP a
// block of each. A packing that does not divide H / H_kv is refused, naming
// the key. On the emulator (three runs in CI) one tile shape a case, in turn.
// Then with packed documents and ATM (test_documents: a start inside the
// first 64-row tile, one on its boundary, an EOS-only document), at every
// tile shape (on the emulator at d_h = 64 only): the packed blocks skip the
// key tiles before their first row's document as the unpacked ones do, with
// the same bits.
TEST(CudaOps, AttentionFa2HeadPacking) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  auto cpu = make_backend<float>("cpu");
  struct Heads {
    int H, Hkv;
  };
  const AttentionTile tiles[] = {AttentionTile::T64x64, AttentionTile::T64x128, AttentionTile::T128x64,
                                 AttentionTile::T128x128};
  int n_case = 0, packed_runs = 0;
  for (int dh : {32, 64, 96, 128})
    for (const Heads hk : {Heads{8, 2}, Heads{4, 2}}) {
      AttnShape s;
      s.B = 1;
      s.Tq = s.Tk = 67;
      s.q_pos0 = 0;
      s.H = hk.H;
      s.Hkv = hk.Hkv;
      s.dh = dh;
      const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
      const size_t nl = size_t(s.B) * s.H * s.Tq;
      DynBuffer<float> gq(*gpu, DType::BF16, nq), gk(*gpu, DType::BF16, nk), gv(*gpu, DType::BF16, nk);
      const Vec q = bf16_round_trip(*gpu, randn(nq, 60 + dh), gq), k = bf16_round_trip(*gpu, randn(nk, 61 + dh), gk),
                v = bf16_round_trip(*gpu, randn(nk, 62 + dh), gv);
      std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
      for (int t = 2; t + 1 < s.Tq; t += 3) open[size_t(t)] = 1;
      const AtmLayout lay = atm_layout(open, s.B, s.Tq);
#ifdef WIOLA_CUDA_EMU
      const int n_variants = dh == 64 ? 3 : 2;
#else
      const int n_variants = 3;
#endif
      for (int variant = 0; variant < n_variants; ++variant) {
        // 0: causal, 1: ATM, 2: ATM with documents.
        const bool with_atm = variant >= 1, with_docs = variant == 2;
        const std::vector<int32_t> docs = with_docs ? test_documents(s.B, s.Tq) : std::vector<int32_t>{};
        std::vector<uint8_t> v_open = open;
        if (with_docs) no_merge_across(v_open, docs, s.B, s.Tq);
        const AtmLayout v_lay = with_docs ? atm_layout(v_open, s.B, s.Tq) : lay;
        GpuAttnCall c(*gpu, s, v_lay, v_open, gk.data(), gv.data(), with_atm, docs);
        auto run_gpu = [&](AttentionTile tile, HeadsPerBlock hp) {
          set_cuda_backend_options(
              *gpu, {.attention = AttentionFwd::Fa2, .attention_tile = tile, .attention_heads_per_block = hp});
          gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data());
          Vec l(nl);
          gpu->download(l.data(), c.glse.data(), c.glse.bytes());
          return std::vector<Vec>{bf16_download(*gpu, c.go.data(), nq), l};
        };
        // The unpacked forward at each key tile (64, 128 keys), run when a
        // packed forward at that key tile is first compared with it.
        std::vector<Vec> unpacked[2];
        auto unpacked_at = [&](int key_tile) -> const std::vector<Vec>& {
          if (unpacked[key_tile].empty()) unpacked[key_tile] = run_gpu(tiles[key_tile], HeadsPerBlock::One);
          return unpacked[key_tile];
        };

        // The CPU on the same (bf16-valued) inputs, forward only.
        const std::vector<Vec> ref =
            cpu_attention(*cpu, *gpu, s, AttnInputs{q, k, v, {}, v_open, v_lay, docs}, c, with_atm);

        const char* names[] = {"o", "lse"};
        const double tols[] = {2e-2, 1e-3};
        const std::string name = "dh=" + std::to_string(dh) + " H=" + std::to_string(s.H) + "/" +
                                 std::to_string(s.Hkv) + (with_atm ? " ATM" : "") + (with_docs ? " docs" : "");
        for (int t = 0; t < 4; ++t) {
#ifdef WIOLA_CUDA_EMU
          // One tile shape a case, in turn: each with HP 2 at every head dim,
          // with HP 4 at two. (Documents: every tile shape.)
          if (!with_docs && t != (n_case + dh / 32 - 1) % 4) continue;
#endif
          const std::vector<Vec>& unpacked_here = unpacked_at(t % 2);
          for (int hp : {2, 4}) {
            if (s.H / s.Hkv % hp != 0) continue;
#ifdef WIOLA_CUDA_EMU
            wiola_emu::record_launches(true);
#endif
            const auto got = run_gpu(tiles[t], hp == 2 ? HeadsPerBlock::Two : HeadsPerBlock::Four);
            const std::string kernel = "fa2 " + std::string(to_string(tiles[t])) + " hp" + std::to_string(hp);
            ++packed_runs;
#ifdef WIOLA_CUDA_EMU
            std::vector<wiola_emu::LaunchShape> launches;  // the fa2 forward's
            for (auto& l : wiola_emu::recorded_launches())
              if (l.name.rfind("k_attention_fwd_fa2<", 0) == 0) launches.push_back(l);
            wiola_emu::record_launches(false);
            // One launch, the packed grid: rows / HP of each of HP heads a block.
            const int rows = (t < 2 ? 64 : 128) / hp;
            ASSERT_EQ(launches.size(), size_t(1)) << name << " " << kernel;
            EXPECT_EQ(launches[0].grid[0], unsigned((s.Tq + rows - 1) / rows)) << name << " " << kernel;
            EXPECT_EQ(launches[0].grid[1], unsigned(s.H / hp)) << name << " " << kernel;
            EXPECT_EQ(launches[0].block[0], unsigned(2 * rows * hp)) << name << " " << kernel;
#endif
            for (size_t u = 0; u < 2; ++u) {
              const double e = rel(ref[u], got[u]);
              std::printf("  attention bf16 %-18s %-17s %-3s max rel %.2e (tol %.0e)\n", name.c_str(), kernel.c_str(),
                          names[u], e, tols[u]);
              EXPECT_LT(e, tols[u]) << name << " " << kernel << " " << names[u];
              // The unpacked forward's bits at the same key tile.
              const Vec& same = unpacked_here[u];
              EXPECT_EQ(0, std::memcmp(got[u].data(), same.data(), same.size() * sizeof(float)))
                  << name << " " << kernel << " " << names[u] << ": differs from the unpacked forward";
            }
          }
        }
        if (!with_docs) ++n_case;
      }
      // A packing that does not divide the heads of a KV group is refused.
      if (s.H / s.Hkv == 2) {
        GpuAttnCall c(*gpu, s, lay, open, gk.data(), gv.data(), false);
        set_cuda_backend_options(*gpu,
                                 {.attention = AttentionFwd::Fa2, .attention_heads_per_block = HeadsPerBlock::Four});
        try {
          gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data());
          ADD_FAILURE() << "attention_heads_per_block = 4 with H / H_kv = 2 was not refused";
        } catch (const wiola::Error& e) {
          EXPECT_NE(std::string(e.what()).find("train.cuda_attention_heads_per_block"), std::string::npos) << e.what();
        }
      }
      set_cuda_backend_options(*gpu, {});
    }
#ifdef WIOLA_CUDA_EMU
  // 16 cases, one tile each: HP 2 and 4 at ratio 4, HP 2 at ratio 2; documents (d_h 64) every tile
  EXPECT_EQ(packed_runs, 24 + 12);
#else
  // 16 cases and 8 with documents, every tile: HP 2 and 4 at ratio 4, HP 2 at ratio 2
  EXPECT_EQ(packed_runs, 96 + 48);
#endif
}

}  // namespace
}  // namespace wiola
