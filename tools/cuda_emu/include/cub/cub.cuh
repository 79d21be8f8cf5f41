// cub for the emulator (tools/cuda_emu/emu.h): the radix sort the CUDA
// backend uses, as a stable sort on the host (radix sort is stable too).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace cub {

struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                               V* vals_out, int n, int begin_bit = 0, int end_bit = int(sizeof(K) * 8),
                               cudaStream_t = nullptr) {
    static_assert(std::is_integral_v<K>, "emulated radix sort: integer keys only");
    if (!tmp) {
      tmp_bytes = 256 + size_t(n) * (sizeof(K) + sizeof(V));  // the size is all the first call returns
      return cudaSuccess;
    }
    if (n < 0 || begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit >= end_bit) return cudaErrorInvalidValue;
    // Radix order of the key bits [begin_bit, end_bit): signed keys with the sign bit flipped.
    using U = std::make_unsigned_t<K>;
    auto radix = [&](K k) {
      U u = U(k);
      if constexpr (std::is_signed_v<K>) u ^= U(U(1) << (sizeof(K) * 8 - 1));
      const int bits = end_bit - begin_bit;
      const U mask = bits >= int(sizeof(U) * 8) ? U(~U(0)) : U((U(1) << bits) - 1);
      return U((u >> begin_bit) & mask);
    };
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return radix(keys_in[a]) < radix(keys_in[b]); });
    std::vector<K> k(static_cast<size_t>(n));
    std::vector<V> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      k[size_t(i)] = keys_in[order[size_t(i)]];
      v[size_t(i)] = vals_in[order[size_t(i)]];
    }
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), vals_out);
    return cudaSuccess;
  }
};

}  // namespace cub
