// One or two tokens' product with a weight, read row block by row block, the blocks ahead asked for while
// one is summed (issue 37; attnlab/linear/prefetch.py builds this file with torch.compile's C++ toolchain and
// calls it).
//
//     out[n, o] = sum_i float(x[n, i]) * float(w[o, i])  (+ float(bias[o])), in float32, then x's dtype
//
// Shapes: N = rows of x (1 or 2), d_in, d_out = the weight's features; w (d_out, d_in) row-major.
//
// Why it exists: a decode step streams every weight once, and on the machine of docs/benchmarks.md the
// library kernels (PyTorch's BLAS, oneDNN, the loop Inductor writes) read a bfloat16 weight well below
// memory's rate (benchmarks/stream_rates.py), while they read a float32 one at nearly all of it. Widening bfloat16 costs instructions per
// cache line, so fewer of the weight's lines are in flight at once, and the hardware's prefetchers do not
// make up for it on rows this short. Here each block of rows, while it is summed, asks for the matching
// line of the next block (`ahead` blocks on) into the first-level cache, and for the line of the block
// kFar blocks further on into the outer caches (locality 1: x86's prefetcht2, which recent Intel
// cores fill into the second level; Arm's pldl3keep), so the memory system works on the next lines
// whatever the arithmetic costs. The sums are the same as without it: a prefetch changes no value.
//
// A row of x is summed the same way whether it comes alone or with another: its numbers never depend on
// the other row of the call. Vectors are ATen's own (at::vec, what Inductor's loops use), so the file builds
// for whichever vector instructions torch.compile picks on this CPU.

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#ifdef ATTNLAB_PREFETCH_PROBE
// A build that records where each ask points instead of asking (tests/test_prefetch.py builds the file with this
// defined): a prefetch changes no number, so only its addresses show that it asks for rows ahead of the sum.
namespace probe {
int64_t* asks = nullptr;  // (address, locality) pairs, in the order asked
int64_t room = 0, count = 0;
}  // namespace probe
extern "C" void attnlab_prefetch_probe(int64_t* asks, int64_t room) {  // where the next asks go; count from 0
  probe::asks = asks, probe::room = room, probe::count = 0;
}
extern "C" int64_t attnlab_prefetch_probe_count() { return probe::count; }
#define ATTNLAB_ASK(address, locality)                                    \
  do {                                                                    \
    if (probe::count < probe::room) {                                     \
      probe::asks[2 * probe::count] = reinterpret_cast<int64_t>(address); \
      probe::asks[2 * probe::count + 1] = locality;                       \
    }                                                                     \
    ++probe::count;                                                       \
  } while (0)
#else
#define ATTNLAB_ASK(address, locality) __builtin_prefetch(address, 0, locality)
#endif

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kRows = 4;   // weight rows summed together: four streams, one x vector loaded for all
constexpr int64_t kLine = 64;  // bytes in a cache line, the unit a prefetch asks for
// blocks beyond `ahead` whose lines go to the outer caches: on the machine of docs/benchmarks.md, asking for
// the next block into the first level and the one kFar further into the outer levels read bfloat16 about 10%
// faster than the first level alone, and float32 at the same rate (kFar of 1, 2, 4 and 8 swept; not kept)
constexpr int64_t kFar = 2;

template <typename T>
inline Vec widen(const T* p, int64_t count) {  // count values of T, as float32
  if constexpr (std::is_same_v<T, float>) {
    return Vec::loadu(p, count);
  } else {
    if (count == Vec::size()) {  // a whole vector: one load of exactly its values, widened
      Vec out;
      at::vec::load_fp32_from_bf16(p, out);
      return out;
    }
    return at::vec::convert<float>(at::vec::Vectorized<T>::loadu(p, count));  // a tail, zero-filled past count
  }
}

template <typename T, int N>
void product(const T* x, const T* w, const T* bias, T* out, int64_t d_out, int64_t d_in, int64_t ahead,
             int threads) {
  constexpr int64_t width = Vec::size();
  const int64_t per_line = kLine / static_cast<int64_t>(sizeof(T));
  std::vector<float> xf(static_cast<size_t>(N * d_in));  // x widened once: (N, d_in)
  for (int64_t k = 0; k < N * d_in; ++k) xf[k] = static_cast<float>(x[k]);
  const int64_t blocks = (d_out + kRows - 1) / kRows;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * kRows;
    const int64_t rows = std::min(kRows, d_out - first);
    // the block `ahead` blocks on, and the one kFar further, when it is whole: ahead + 1 (+ kFar) whole blocks
    // from `first` (no product that could overflow: ahead is at most d_out); none past the weight's end
    const int64_t whole = (d_out - first) / kRows;
    const bool has_next = ahead > 0 && ahead < whole;
    const bool has_far = ahead > 0 && ahead + kFar < whole;
    const T* next = w + (has_next ? first + ahead * kRows : first) * d_in;
    const T* far = w + (has_far ? first + (ahead + kFar) * kRows : first) * d_in;
    Vec acc[N][kRows];
    for (int n = 0; n < N; ++n)
      for (int64_t r = 0; r < kRows; ++r) acc[n][r] = Vec(0.f);
    for (int64_t i = 0; i < d_in; i += width) {
      const int64_t count = std::min(width, d_in - i);
      if (has_next && i % per_line == 0)
        for (int64_t r = 0; r < kRows; ++r) ATTNLAB_ASK(next + r * d_in + i, 3);  // first level
      if (has_far && i % per_line == 0)
        for (int64_t r = 0; r < kRows; ++r) ATTNLAB_ASK(far + r * d_in + i, 1);  // outer levels
      for (int64_t r = 0; r < rows; ++r) {
        const Vec wv = widen(w + (first + r) * d_in + i, count);
        for (int n = 0; n < N; ++n) acc[n][r] = at::vec::fmadd(wv, Vec::loadu(xf.data() + n * d_in + i, count), acc[n][r]);
      }
    }
    for (int n = 0; n < N; ++n) {
      for (int64_t r = 0; r < rows; ++r) {
        float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& c) { return a + c; }, acc[n][r]);
        if (bias != nullptr) sum += static_cast<float>(bias[first + r]);
        out[n * d_out + first + r] = static_cast<T>(sum);
      }
    }
  }
}

template <typename T>
int dispatch_rows(const void* x, const void* w, const void* bias, void* out, int64_t n, int64_t d_out,
                  int64_t d_in, int64_t ahead, int threads) {
  const T* xs = static_cast<const T*>(x);
  const T* ws = static_cast<const T*>(w);
  const T* bs = static_cast<const T*>(bias);
  T* os = static_cast<T*>(out);
  if (n == 1) {
    product<T, 1>(xs, ws, bs, os, d_out, d_in, ahead, threads);
  } else if (n == 2) {
    product<T, 2>(xs, ws, bs, os, d_out, d_in, ahead, threads);
  } else {
    return 2;  // rows the file was not built for: the caller sends them elsewhere
  }
  return 0;
}

}  // namespace

// dtype: 0 float32, 1 bfloat16. Returns 0, or 1 for a dtype and 2 for a row count it does not serve.
extern "C" int attnlab_prefetch_gemv(int dtype, const void* x, const void* w, const void* bias, void* out,
                                     int64_t n, int64_t d_out, int64_t d_in, int64_t ahead, int threads) {
  if (dtype == 0) return dispatch_rows<float>(x, w, bias, out, n, d_out, d_in, ahead, threads);
  if (dtype == 1) return dispatch_rows<c10::BFloat16>(x, w, bias, out, n, d_out, d_in, ahead, threads);
  return 1;
}
