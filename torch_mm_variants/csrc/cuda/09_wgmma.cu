// Rung 9, wgmma: the Hopper (sm_90a) kernel. Rung 8 keeps every warp busy with address math,
// cp.async issue, ldmatrix and 16x8 mma.sync; here each of those jobs moves to hardware built
// for it, and the warps are split by role.
//
// - TMA: one thread copies a whole 2-D tile per instruction (cp.async.bulk.tensor), swizzled
//   (128-byte pattern) on its way into shared memory so that the tensor cores read it without
//   bank conflicts. Edges come back zero-filled: no predicates, no tails in the main loop. Only
//   the last tile row of a K-major A is copied in boxes of exactly its rows inside M: the copy
//   engine fills rows past a tensor's end slowly (H100, bf16, nn.Linear layout: 160, 192 and 200
//   tokens against a 4096 x 4096 weight went from 0.51-0.68x of torch.mm to 0.73-0.84x back to
//   back in a CUDA graph, and from 0.68-0.78x to 0.79-0.84x with L2 cleared).
// - wgmma: a warpgroup (4 warps) multiplies a 64 x BN tile by 16 of K per instruction, both
//   operands read from shared memory through descriptors, float accumulators in registers. No
//   fragments are loaded: the registers are free for BN / 2 accumulators per thread. The
//   instruction's transpose bits read M- or N-contiguous tiles, so all four operand layouts run in
//   place (A row-major or a.t(); B as [K, N] or an nn.Linear weight's w.t()).
// - Warp specialization: one producer warpgroup issues the copies into a kStages-deep ring and
//   two consumer warpgroups (64 rows each of a 128 x 256 block tile) issue the wgmmas. mbarriers
//   carry "stage full" (TMA transaction bytes) and "stage free" (one arrival per consumer warp).
//   setmaxnreg moves registers from the producer, which needs few, to the consumers.
// - Persistent grid: one block per SM walks output tiles in grouped order (grouped_tile), so the
//   producer loads the next tile's stages while the consumers store the previous one. Each launch
//   is a programmatic dependent launch: its blocks set up their barriers while the kernel before
//   them finishes (when that kernel lets them, as this one does), which hides most of a launch's
//   fixed cost between back-to-back products.
// - Clusters: two blocks on neighbouring SMs take the two 128-row halves of a 256 x 256 tile and
//   share its B tile: each copies half of it and TMA multicasts the half into both blocks' shared
//   memory, so a block reads 32 KB of L2 per stage instead of 48 (with 128 x 320 tiles, 36 of 56).
//   A stage is free again once the consumers of both blocks have read it. Over an odd count of
//   tile rows, the last pair's second block has no rows of C: it only loads B for its partner.
// - Split K for outputs too small to give half the SMs a tile, when K is long enough to repay it
//   (e.g. 128 or 256 tokens against a 4096 x 4096 weight): each tile (or pair sharing B) is split
//   over up to 8 blocks of a cluster, each a range of K (up to K = 8192 narrow tiles, in as many
//   splits as fill three quarters of the SMs). Each leaves its float sums in its own shared
//   memory (over the drained ring); after a cluster barrier every block adds a share of its tile
//   over the splits (distributed shared memory), in split order, and stores it. No atomics and
//   no second launch: the same bits on every run. Beyond K = 8192, wide tiles and B sharing
//   keep the L2 traffic per multiply-add low, which is what bounds these small-M products.
// - Split tails: where the last wave of tiles would leave most SMs idle, the tile columns that
//   fill whole waves run first and the others follow in a second launch with K split.
// - Transposed tiles: an nn.Linear product with a few hundred tokens can run as C^T = W X^T, the
//   weight in 128-row tiles and the tokens in tiles of 160 or 192 (wgmma's N comes in steps of
//   8, its M in steps of 64): 320 tokens fill two tiles of 160 where 128-row tiles leave the
//   third half empty. The epilogue stores each tile transposed. Few enough of them split K in
//   place of wide tiles (e.g. 320 tokens against a 4096 x 4096 or 4096 x 14336 weight, or 224
//   against 1024 x 14336 in tiles of 80), their sums added as above and stored transposed.
// - Tile shapes in between: 128 x 192 tiles where they take fewer waves than 128 x 256 ones
//   (e.g. 1536^3: 96 tiles of 192 in one wave, where 72 of 256 leave 60 SMs idle and still take
//   as long), and 128 x 64 tiles for outputs that fit one wave of them (squares up to 1024): more
//   SMs at work on the few K steps that small products have, and on a K of up to 4096 where
//   narrow tiles would split it (e.g. 256 tokens against a 4096 x 4096 weight), or split in two
//   where 64 of them make half a wave.
// - Operands read once: where one cluster alone reads an operand's tiles (B when the output has
//   one group of tile rows, A when it has one tile column: a few hundred tokens against an
//   nn.Linear weight), the copies mark its lines evict-first in L2, as rung 11 does for decode.
//   On an H100 (bf16, 96-256 tokens on the three Llama weights, two runs of two rounds) back to
//   back in a CUDA graph this ran 2-6% faster on most shapes (up to 2% slower on a few), with L2
//   cleared before each call from 8% faster to 3% slower (96-128 tokens on 4096 x 14336).
//
// Tile parameters (TileShape): BM x BN = 128 x 256 with 4 stages of BK = 64 (one 128-byte swizzle
// row of 16-bit elements, 48 KB a stage); 128 x 128 with 6 stages where 256-wide tiles would leave
// SMs idle (paired only where the tile rows pair up evenly, the tiles fill more than half the SMs,
// and K is long or the waves full: pairing_pays); 128 x 320 with 3 stages (each k16 step a wgmma of
// N = 256 and one of N = 64) where N divides into them with fewer waves of tiles, as on an
// nn.Linear weight of 14336 rows; 128 x 192 with 4 stages and 128 x 64 with 8; transposed, 128 x
// 160 with 5 stages and 128 x 192 with 4, for K splits 128 x 80 with 7, and 128 x 96 with 6 (in
// K splits, and in one wave over all of K where the tokens fill them).
// fp16 and bf16 in any layout, float32 accumulation. The epilogue converts the accumulators to
// the input dtype into a swizzled staging buffer and stores it with TMA, so the consumers start
// the next tile while the copy engine writes the last one.
//
// float32 runs in TF32 where the user allows it for matmuls (as for rung 8), with one operand
// K-major. tf32 wgmma has no transposes: it reads K-major tiles only from shared memory, but takes
// its A operand from registers in any layout. A stage still holds one 128-byte swizzle row of K per
// tile row, 32 floats where it held 64 16-bit elements, and a k8 tf32 wgmma takes as long as a k16
// one at half the multiply-adds: the pipeline, the tile shapes and the planner (which counts K in
// steps) are those of 16 bits. The nn.Linear layout (x @ w.t()) runs as it is, and so does an A
// stored transposed against a K-major B (a.t() @ w.t()), A's fragments loaded into registers and
// rounded to the nearest tf32 (load_a_fragment); a row-major B runs transposed, C^T = B^T A^T, B^T
// the operand in registers and each tile stored transposed (StoredTransposed). The transposed token
// tiles stay 16-bit only. Where neither operand is K-major (a.t() @ w), the smaller one is copied
// K-major first (k_major_copy). float32 with TF32 off takes rung 8's kernel (3xTF32 for float32's
// accuracy).
//
// TMA needs 16-byte aligned base addresses and leading dimensions: other views take rung 8's
// kernel instead. The kernel exists only in the sm_90a build (-gencode arch=compute_90a,
// code=sm_90a) and is listed only on compute capability 9.0 devices.
#include "common.cuh"
#include "epilogue.cuh"
#include "hopper.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "tensor_map.cuh"

#include <ATen/Context.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace mm_variants::cuda {
namespace {

constexpr int BM = 128;
// A K step: one 128-byte swizzle row of K in every row of a tile, BK<T> elements (64 16-bit
// ones, 32 floats). Its bytes, copies and wgmma time are the same for every T.
template <typename T>
constexpr int BK = kTmaBoxInnerOf<T>;
constexpr int kRowBytes = kTmaRowBytes;
[[maybe_unused]] constexpr int kWgmmaKBytes = 32;  // one wgmma: 16 16-bit or 8 tf32 of K
[[maybe_unused]] constexpr int kGroupM = 16;  // tile rows per group of the grouped tile order
constexpr int kConsumers = 2;                      // warpgroups of 64 x BN each
constexpr int kThreads = 128 * (1 + kConsumers);   // the producer warpgroup comes first
[[maybe_unused]] constexpr int kConsumersBarrier = 1 + kConsumers;  // both consumers (1, 2: each)
constexpr int kATileBytes = BM * kRowBytes;        // A in one stage
[[maybe_unused]] constexpr int kBox = kTmaBoxInner;  // 64: 16-bit elements in a swizzle row
[[maybe_unused]] constexpr int kBoxBytes = 64 * kRowBytes;  // a box of 64 rows, 8 KB
// The epilogue stages a consumer's tile in a buffer of 64 rows x 256 bytes (two boxes of 64 rows).
constexpr int kStagingRowBytes = 2 * kRowBytes;
constexpr int kStagingBytes = 64 * kStagingRowBytes;
static_assert(BM == kConsumers * 64, "64 rows per consumer");

// float32's A stored M-major goes to tf32 wgmma from registers (load_a_fragment): it reads
// K-major tiles only from shared memory.
template <typename T, bool kAK>
constexpr bool kARegisters = std::is_same_v<T, float> && !kAK;
// An M/N-major tile's boxes: one swizzle row of M (or N) x a stage's BK lines of K (64 x 64
// 16-bit elements, 32 x 32 floats).
template <typename T>
constexpr int kMajorBoxRows = kTmaBoxInnerOf<T>;
template <typename T>
constexpr int kMajorBoxBytes = BK<T> * kRowBytes;

// The block tile, BM x BN, and the stages of its ring. Wide tiles read the least L2 per
// multiply-add; narrow ones, with more stages in the same shared memory, keep every SM busy on
// outputs that have too few wide tiles (e.g. 2048 x 1024); 128 x 192 ones fill waves that
// neither fills (e.g. 1536^3), and 128 x 64 ones spread small products over more SMs.
//
// TRANSPOSED: the kernel computes C^T = B^T A^T, with the nn.Linear weight as the M operand and
// the tokens as the N operand (or float32's row-major B^T and A: StoredTransposed), and stores
// each tile transposed (store_tile_transposed_async).
// wgmma's N comes in steps of 8 where its M comes in steps of 64, so a few hundred tokens fit
// tiles of 160 or 192 columns with no empty rows: 320 tokens make two tiles of 160, where
// 128-row tiles make three, the last half empty.
template <int BN_, int STAGES, bool TRANSPOSED = false>
struct TileShape {
  static constexpr int BN = BN_, kStages = STAGES;
  static constexpr bool kTransposed = TRANSPOSED;
  static constexpr int kBTileBytes = BN * kRowBytes;     // B in one stage
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;  // what TMA delivers to a stage
  static constexpr int kAccumulators = BN / 2;           // per consumer thread
  // Columns of C in T per store round: the whole staging buffer, or half of it twice over (one
  // half is filled while TMA reads the other) where BN's row of T does not fill whole buffers.
  // Transposed, a round stores C rows (BN / rounds of them, 64 columns each): as many rounds as
  // fill the buffer (128 rows of 16-bit elements, 64 of floats).
  template <typename T>
  __host__ __device__ static constexpr int store_cols() {
    constexpr int kRowsPerBuffer = kStagingBytes / (64 * static_cast<int>(sizeof(T)));
    if constexpr (TRANSPOSED) return BN / ((BN + kRowsPerBuffer - 1) / kRowsPerBuffer);
    constexpr int kRow = BN * static_cast<int>(sizeof(T));
    return (kRow % kStagingRowBytes == 0 ? kStagingRowBytes : kRowBytes) / sizeof(T);
  }
  template <typename T>
  __host__ __device__ static constexpr int store_buffers() {
    return TRANSPOSED ? 1 : kStagingRowBytes / (store_cols<T>() * sizeof(T));
  }
  static constexpr int kPartialPitch = BN + 8;           // floats per row of a split's sums
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kConsumers * kStagingBytes + 2 * kStages * 8 + 1024;  // + alignment
  static_assert(kAccumulators <= 160 && kSmemBytes <= 227 * 1024, "fits one SM and its registers");
  static_assert(BM * kPartialPitch * 4 <= kStages * kStageBytes, "the partial tile fits the ring");
};
using WideTile = TileShape<256, 4>;
using NarrowTile = TileShape<128, 6>;
using WiderTile = TileShape<320, 3>;
using Tokens160Tile = TileShape<160, 5, true>;
using Tokens192Tile = TileShape<192, 4, true>;
using Tokens80Tile = TileShape<80, 7, true>;
using Tokens96Tile = TileShape<96, 6, true>;
using MidTile = TileShape<192, 4>;
using SlimTile = TileShape<64, 8>;

// Registers per thread after setmaxnreg: up to 160 accumulators plus addressing for the
// consumers, the minimum for the producer; 128 * 40 + 256 * 232 fits the SM's 64K.
[[maybe_unused]] constexpr int kProducerRegs = 40, kConsumerRegs = 232;

// K splits for outputs of few tiles: clusters of at most 8 blocks (the portable limit).
constexpr int kMaxClusterBlocks = 8;
// The planner counts K in steps, which take as long in every dtype; K sizes in its comments are
// those of 16-bit inputs (float32's are half as long).
// Adding the splits costs a few microseconds per tile, which only a long K repays: on an H200 a
// split lost a third of the speed at K = 512 and 1024 and gained up to a quarter at K >= 4096.
// So every split has at least kMinStepsToSplit / kMaxClusterBlocks = 8 K steps, more than the
// ring holds: its loads and its multiply-adds overlap as in an unsplit tile.
constexpr int kMinStepsToSplit = 4096 / BK<uint16_t>;
constexpr int kMinStepsPerSplit = kMinStepsToSplit / kMaxClusterBlocks;

// The K steps of problem g.
template <class G>
int64_t k_steps_of(const G& g) {
  return ceil_div(g.K, BK<typename G::scalar>);
}

// Whether both operands of problem G are K-contiguous: the nn.Linear layout (x @ w.t()), the
// one whose tiles tf32 wgmma reads both from shared memory, and the one that runs transposed in
// token tiles (16-bit only).
template <class G>
constexpr bool kBothKMajor = decltype(G::a)::k_contiguous && decltype(G::b)::k_contiguous;
template <class G>
constexpr bool kTokenTiles = kBothKMajor<G> && sizeof(typename G::scalar) == 2;

// A product that the kernel computes transposed and stores back in place: problem G is
// C^T = B^T A^T of the caller's C = A B, and its tile (m, n) is C's element (n, m). float32's
// row-major product runs so (stored_transposed), as the nn.Linear layout's token tiles do.
template <class G>
struct StoredTransposed : G {};
template <class G>
constexpr bool kStoresTransposed = false;
template <class G>
constexpr bool kStoresTransposed<StoredTransposed<G>> = true;

// Tile shape S as problem G runs it: transposed where G is stored transposed.
template <class S, class G>
using ShapeFor = TileShape<S::BN, S::kStages, S::kTransposed || kStoresTransposed<G>>;

// Output tiles of an M x N product, counting kCluster tiles stacked along M as one; the host
// checks that the count fits an int.
template <class S, int kCluster = 1>
__host__ __device__ __forceinline__ int64_t tile_count(int64_t M, int64_t N) {
  return ((M - 1) / (kCluster * BM) + 1) * ((N - 1) / S::BN + 1);
}

// Where a stage's tiles live and how wgmma step `step` of them (kWgmmaKBytes of K) is described
// to wgmma (hopper.cuh). kKMajor: K is the contiguous dimension of the tile (16-bit tiles may
// be M- or N-major: 16 rows of K per step).
template <bool kKMajor>
__device__ __forceinline__ uint64_t step_descriptor(const uint8_t* tile, int step) {
  if constexpr (kKMajor) return hopper::smem_descriptor(tile + kWgmmaKBytes * step, 16, 1024);
  return hopper::smem_descriptor(tile + 16 * kRowBytes * step, kBoxBytes, 1024);
}

// The tiles of a persistent block: every gridDim.x / kCluster-th cluster tile from its cluster's
// index. A cluster tile is kCluster block tiles stacked along M that share their B tile; each
// block of the cluster takes one of them (its rank). With K split, the blocks of a column of the
// grid (a cluster along y) take the same tiles, each a range of their K steps.
template <class S, int kCluster>
struct TileWalk {
  int cluster_tiles, M, N;

  __device__ __forceinline__ TileWalk(int M_, int N_)
      : cluster_tiles(static_cast<int>(tile_count<S, kCluster>(M_, N_))), M(M_), N(N_) {}
  __device__ __forceinline__ int first() const { return blockIdx.x / kCluster; }
  __device__ __forceinline__ int stride() const { return gridDim.x / kCluster; }
  // The block's output origin (first row, first column) in cluster tile t.
  __device__ __forceinline__ int2 origin(int t, int rank) const {
    const int2 o = grouped_tile<kCluster * BM, S::BN, kGroupM / kCluster>(t, M, N);
    return make_int2(o.x + rank * BM, o.y);
  }
};

// The K steps (BK each) of a block: all of them, or its split's share.
struct StepRange {
  int begin, end;
};

// Where a block sits in its cluster: `rank` in its group of kCluster blocks that share B tiles,
// the group's first block at cluster rank `group_cta` (with K split, one group per split).
struct ClusterPlace {
  int rank, group_cta;
};

// The producer thread: for each tile and K step, waits until the stage is free in every block of
// the cluster, then copies A (BM x BK) into its own block and its 1 / kCluster share of B
// (BN x BK) into every block of the cluster. K-major tiles are boxes of BK x rows; M/N-major
// tiles are boxes of kMajorBoxRows x BK side by side (16-bit: kBoxBytes apart, the descriptors'
// leading offset).
template <class S, typename T, bool kAK, bool kBK, int kCluster>
__device__ void produce(const CUtensorMap* a_map, const CUtensorMap* a_tail_map,
                        const CUtensorMap* b_map, uint8_t* a_tiles, uint8_t* b_tiles,
                        uint64_t* full, uint64_t* empty, int M, int N, StepRange steps,
                        ClusterPlace place) {
  const TileWalk<S, kCluster> walk(M, N);
  const int rank = place.rank;
  const uint16_t group_ctas = static_cast<uint16_t>(((1u << kCluster) - 1) << place.group_cta);
  // An operand that one cluster alone reads (B over one group of tile rows, A over one tile
  // column: a few hundred tokens against a weight) is read once, so L2 may give its lines up
  // first. The others are read again by other clusters and keep L2's default.
  const hopper::L2Policy a_l2 = N <= S::BN ? hopper::l2_evict_first() : hopper::L2Policy{};
  const hopper::L2Policy b_l2 =
      M <= kCluster * BM ? hopper::l2_evict_first() : hopper::L2Policy{};
  const auto load_b = [&](uint8_t* dst, uint64_t* bar, int c0, int c1) {
    if constexpr (kCluster == 1) {
      hopper::tma_load_2d(dst, b_map, bar, c0, c1, b_l2);
    } else {
      hopper::tma_load_2d_multicast(dst, b_map, bar, c0, c1, group_ctas, b_l2);
    }
  };
  int it = 0;
  for (int t = walk.first(); t < walk.cluster_tiles; t += walk.stride()) {
    const int2 origin = walk.origin(t, rank);
    const int n0 = origin.y;
    // A pair's second block past M (an odd number of tile rows) only passes its share of B on.
    const bool rows_past_m = origin.x >= M;
    // A K-major tile that ends past M takes a_tail_map's box of exactly its rows inside M: the
    // copy engine fills box rows past a tensor's end with zeros, slowly. The tile's other rows
    // keep what the ring held; they make rows of C past M, which are never stored. Of float32's
    // M-major boxes (kARegisters), those past M are left out likewise.
    constexpr int kBoxRows = kMajorBoxRows<T>;
    const int rows_in_m = min(BM, M - origin.x);
    const int a_rows = rows_past_m           ? 0
                       : kAK                 ? rows_in_m
                       : kARegisters<T, kAK> ? (rows_in_m + kBoxRows - 1) / kBoxRows * kBoxRows
                                             : BM;
    const CUtensorMap* a_box_map = a_rows == BM ? a_map : a_tail_map;
    for (int ks = steps.begin; ks < steps.end; ++ks, ++it) {
      const int s = it % S::kStages, k0 = ks * BK<T>;
      hopper::mbarrier_wait(&empty[s], ((it / S::kStages) & 1) ^ 1);
      hopper::mbarrier_arrive_expect_tx(&full[s], S::kStageBytes - (BM - a_rows) * kRowBytes);
      uint8_t* a = a_tiles + s * kATileBytes;
      uint8_t* b = b_tiles + s * S::kBTileBytes;
      if (rows_past_m) {
        // nothing of A to load
      } else if constexpr (kAK) {
        hopper::tma_load_2d(a, a_box_map, &full[s], k0, origin.x, a_l2);
      } else {
        for (int j = 0; j < a_rows / kBoxRows; ++j) {
          hopper::tma_load_2d(a + j * kMajorBoxBytes<T>, a_map, &full[s], origin.x + j * kBoxRows,
                              k0, a_l2);
        }
      }
      if constexpr (kBK) {  // this block's BN / kCluster rows of the tile
        constexpr int kRows = S::BN / kCluster;
        load_b(b + rank * kRows * kRowBytes, &full[s], k0, n0 + rank * kRows);
      } else {  // this block's boxes of the tile: every kCluster-th from its rank
        for (int box = rank; box < S::BN / kBox; box += kCluster) {
          load_b(b + box * kBoxBytes, &full[s], n0 + box * kBox, k0);
        }
      }
    }
  }
}

// Writes a consumer's 64 x BN accumulators to C (rows ldc apart) in T, two columns per store
// where ldc allows it: the epilogue for outputs that TMA cannot address (ldc not a multiple of 8).
// Transposed (S::kTransposed), the tile's row m and column n are C's column m and row n.
template <class S, typename T, class Epi>
__device__ __forceinline__ void store_tile(const float (&acc)[S::kAccumulators], const Epi& epi,
                                           T* c, int ldc, int M, int N, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  // 64-bit: the last tile of an extent near 2^31 reaches past it.
  const int64_t row = int64_t(row0) + 16 * (threadIdx.x / 32 % 4) + lane / 4;
  const bool pairs = ldc % 2 == 0;  // C rows then start 4-byte aligned
#pragma unroll
  for (int j = 0; j < S::BN / 8; ++j) {
    const int64_t col = int64_t(col0) + 8 * j + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = row + 8 * h;
      if (m >= M || col >= N) continue;
      const int m32 = static_cast<int>(m), col32 = static_cast<int>(col);  // inside C
      if constexpr (S::kTransposed) {  // a column of C: one element per row
        c[col * ldc + m] = static_cast<T>(epi(acc[4 * j + 2 * h], m32));
        if (col + 1 < N) c[(col + 1) * ldc + m] = static_cast<T>(epi(acc[4 * j + 2 * h + 1], m32));
        continue;
      }
      T* dst = c + m * ldc + col;
      const float x = epi(acc[4 * j + 2 * h], col32), y = epi(acc[4 * j + 2 * h + 1], col32 + 1);
      if (pairs) {
        Vec<T, 2> v;
        v.v[0] = static_cast<T>(x);
        v.v[1] = static_cast<T>(y);
        *reinterpret_cast<Vec<T, 2>*>(dst) = v;
      } else {
        dst[0] = static_cast<T>(x);
        if (col + 1 < N) dst[1] = static_cast<T>(y);
      }
    }
  }
}

// The epilogue for the rest: the warpgroup writes store_cols<T>() columns of its accumulators
// into its staging buffer, as boxes of 64 rows x 128 bytes with the 128-byte swizzle the copies
// use (conflict-free: the 8 rows of a warp's store land in 8 different 16-byte chunks, or for
// floats 16 chunks in two wavefronts), and one thread hands the boxes to TMA, which stores them
// (clipped at the matrix edges) while the warpgroup moves on. Before a buffer is refilled, the
// stores that read it must have done so.
template <class S, typename T, class Epi>
__device__ __forceinline__ void store_tile_async(const float (&acc)[S::kAccumulators],
                                                 const Epi& epi, uint8_t* staging,
                                                 const CUtensorMap* c_map, int consumer, int row0,
                                                 int col0) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const bool issuer = threadIdx.x % 128 == 0;
  const int barrier = 1 + consumer;
  constexpr int kStoreCols = S::template store_cols<T>();
  constexpr int kBuffers = S::template store_buffers<T>();
  constexpr int kBoxCols = kRowBytes / sizeof(T);  // columns of C in a box
  static_assert(S::BN % kStoreCols == 0 && kStoreCols % kBoxCols == 0, "whole boxes a round");
#pragma unroll
  for (int round = 0; round < S::BN / kStoreCols; ++round) {
    // Round r fills buffer r % kBuffers; the previous tile's rounds (their number may be odd)
    // must all have been read before the first.
    uint8_t* buffer = staging + round % kBuffers * (64 * kStoreCols * sizeof(T));
    if (issuer) {
      if (round == 0) {
        hopper::tma_store_wait_read<0>();
      } else {
        hopper::tma_store_wait_read<kBuffers - 1>();
      }
    }
    hopper::named_barrier_sync(barrier, 128);
#pragma unroll
    for (int jj = 0; jj < kStoreCols / 8; ++jj) {
      const int j = round * (kStoreCols / 8) + jj;
      // The thread's two columns: their bytes in the round's row, then in their box's row.
      const int byte = (8 * jj + 2 * (lane % 4)) * static_cast<int>(sizeof(T));
      uint8_t* box = buffer + byte / kRowBytes * kBoxBytes;
      const int in_row = byte % kRowBytes;
      const int col = col0 + round * kStoreCols + 8 * jj + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * warp + lane / 4 + 8 * h;
        Vec<T, 2> v;
        v.v[0] = static_cast<T>(epi(acc[4 * j + 2 * h], col));
        v.v[1] = static_cast<T>(epi(acc[4 * j + 2 * h + 1], col + 1));
        *reinterpret_cast<Vec<T, 2>*>(box + row * kRowBytes + ((in_row / 16) ^ (row % 8)) * 16 +
                                      in_row % 16) = v;
      }
    }
    hopper::fence_async_shared();
    hopper::named_barrier_sync(barrier, 128);
    if (issuer) {
#pragma unroll
      for (int b = 0; b < kStoreCols / kBoxCols; ++b) {
        hopper::tma_store_2d(c_map, buffer + b * kBoxBytes,
                             col0 + round * kStoreCols + b * kBoxCols, row0);
      }
      hopper::tma_store_commit();
    }
  }
}

// The epilogue of a transposed tile (S::kTransposed): the consumer's 64 rows of the tile are 64
// columns of C, one 128-byte swizzle row of each C row in 16 bits, two boxes of 32 columns in
// float32. A round writes store_cols() of C's rows into the staging buffer, one element per store
// (a thread's neighbouring accumulators lie in neighbouring C rows); the 8 rows of a warp's store
// fall in one or two 16-byte chunks and its 4 columns in 4 chunks of different swizzle phase, so
// the stores are conflict-free. TMA then stores the box (or two) of 64 columns x store_cols()
// rows, clipped at C's edges.
template <class S, typename T, class Epi>
__device__ __forceinline__ void store_tile_transposed_async(const float (&acc)[S::kAccumulators],
                                                            const Epi& epi, uint8_t* staging,
                                                            const CUtensorMap* c_map,
                                                            int consumer, int row0, int col0) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const bool issuer = threadIdx.x % 128 == 0;
  const int barrier = 1 + consumer;
  constexpr int kRows = S::template store_cols<T>();   // rows of C per round
  constexpr int kBoxCols = kRowBytes / sizeof(T);      // columns of C per box
  constexpr int kBoxes = 64 / kBoxCols;
  constexpr int kChunk = 16 / sizeof(T);               // elements per 16-byte chunk
  static_assert(kBoxes * kRows * kRowBytes <= kStagingBytes, "a round fits the buffer");
#pragma unroll
  for (int round = 0; round < S::BN / kRows; ++round) {
    if (issuer) hopper::tma_store_wait_read<0>();  // the buffer's last store has read it
    hopper::named_barrier_sync(barrier, 128);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = 16 * warp + lane / 4 + 8 * h;  // the tile's row: C's column row0 + n
      uint8_t* box = staging + n / kBoxCols * (kRows * kRowBytes);
      const int in_box = n % kBoxCols;
#pragma unroll
      for (int jj = 0; jj < kRows / 8; ++jj) {
        const int j = round * (kRows / 8) + jj;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = 8 * jj + 2 * (lane % 4) + e;  // C's row col0 + round * kRows + m
          const T v = static_cast<T>(epi(acc[4 * j + 2 * h + e], row0 + n));
          *reinterpret_cast<T*>(box + m * kRowBytes + ((in_box / kChunk) ^ (m % 8)) * 16 +
                                in_box % kChunk * sizeof(T)) = v;
        }
      }
    }
    hopper::fence_async_shared();
    hopper::named_barrier_sync(barrier, 128);
    if (issuer) {
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        hopper::tma_store_2d(c_map, staging + b * (kRows * kRowBytes), row0 + b * kBoxCols,
                             col0 + round * kRows);
      }
      hopper::tma_store_commit();
    }
  }
}

// Split K: a consumer's 64 x BN float sums into the block's partial tile, which lies over the
// stage ring. The pitch spreads each half warp's 8-byte stores over all 32 banks.
template <class S>
__device__ __forceinline__ void store_partial(const float (&acc)[S::kAccumulators], float* partial,
                                              int consumer) {
  const int lane = threadIdx.x % 32;
  const int row = consumer * 64 + 16 * (threadIdx.x / 32 % 4) + lane / 4;
#pragma unroll
  for (int j = 0; j < S::BN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* to = partial + (row + 8 * h) * S::kPartialPitch + 8 * j + 2 * (lane % 4);
      *reinterpret_cast<float2*>(to) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
}

// Split K: the sum over the splits, in split order, of the float4 at `at` of a partial tile
// (group rank `rank`) in every split's block.
template <int kCluster>
__device__ __forceinline__ float4 sum_over_splits(const float* at, int rank, int splits) {
  float4 sum = hopper::ld_cluster_float4(hopper::cluster_smem_addr(at, rank));
  for (int s = 1; s < splits; ++s) {
    const float4 v = hopper::ld_cluster_float4(hopper::cluster_smem_addr(at, s * kCluster + rank));
    sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
  }
  return sum;
}

// Split K, after the cluster barrier that follows store_partial: the consumer threads of the
// block of split `split` take every `splits`-th run of their number of float4s of the tile, add
// each over the partial tiles of the same tile (group rank `rank`) in every split, in split
// order (the same bits on every run), and store the sums to C (rows ldc apart) through epi.
// Transposed, a float4 is one column of C in four of its rows, and a warp takes 32 neighbouring
// tile rows, so that each of its four stores writes 32 neighbouring elements of a C row.
template <class S, int kCluster, typename T, class Epi>
__device__ void sum_partials(const float* partial, const Epi& epi, T* c, int ldc, int M, int N,
                             int2 origin, int rank, int split, int splits) {
  constexpr int kQuads = S::BN / 4;  // float4s per row
  constexpr int kSummers = 128 * kConsumers;
  const bool quads = ldc % 4 == 0;  // C rows then start 8-byte aligned
  for (int i = split * kSummers + threadIdx.x - 128; i < BM * kQuads; i += splits * kSummers) {
    const int row = S::kTransposed ? i % BM : i / kQuads;
    const int col = (S::kTransposed ? i / BM : i % kQuads) * 4;
    const int m = origin.x + row, n = origin.y + col;
    if (m >= M || n >= N) continue;
    const float4 sum = sum_over_splits<kCluster>(partial + row * S::kPartialPitch + col, rank,
                                                 splits);
    const float values[4] = {sum.x, sum.y, sum.z, sum.w};
    if constexpr (S::kTransposed) {  // the tile's row m is C's column m, its column n C's row n
      for (int e = 0; e < 4 && n + e < N; ++e) {
        c[static_cast<int64_t>(n + e) * ldc + m] = static_cast<T>(epi(values[e], m));
      }
      continue;
    }
    T* to = c + static_cast<int64_t>(m) * ldc + n;
    if (quads) {
      Vec<T, 4> v;
#pragma unroll
      for (int e = 0; e < 4; ++e) v.v[e] = static_cast<T>(epi(values[e], n + e));
      *reinterpret_cast<Vec<T, 4>*>(to) = v;
    } else {
      for (int e = 0; e < 4 && n + e < N; ++e) to[e] = static_cast<T>(epi(values[e], n + e));
    }
  }
}

// Hands stage `bar` back: each consumer warp arrives on it in every block of its group, since
// every block's producer writes into this block's copy of the stage.
template <int kCluster>
__device__ __forceinline__ void release_stage(uint64_t* bar, ClusterPlace place) {
  if constexpr (kCluster == 1) {
    hopper::mbarrier_arrive(bar);
  } else {
#pragma unroll
    for (int cta = 0; cta < kCluster; ++cta) {
      hopper::mbarrier_arrive_cluster(bar, place.group_cta + cta);
    }
  }
}

// acc[64 x N] (+)= a b for one wgmma step: a k16 wgmma in fp16 or bf16, a k8 one in tf32 for
// float32 inputs (B K-major). a is A's descriptor, or for tf32 its fragment in registers.
template <int N, typename T, bool kAK, bool kBK, class AOperand>
__device__ __forceinline__ void wgmma_step(float (&acc)[N / 2], const AOperand& a,
                                           uint64_t b_desc, bool accumulate) {
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kBK, "tf32 wgmma reads K-major tiles only");
    hopper::wgmma_m64k8_tf32<N>(acc, a, b_desc, accumulate);
  } else {
    constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
    hopper::wgmma_m64k16<N, kBf16, !kAK, !kBK>(acc, a, b_desc, accumulate);
  }
}

// acc (+)= a[64 x k] b[k x BN] for wgmma step `step` of a stage: one wgmma, or for BN > 256 (the
// instruction's largest N) two, the first over B's first 256 columns. Their accumulators are
// consecutive in acc as one wgmma's would be, and 256 columns are whole swizzle atoms (K-major B)
// or whole 64-column boxes (N-major B). a: A's step, as for wgmma_step.
template <class S, typename T, bool kAK, bool kBK, class AOperand>
__device__ __forceinline__ void multiply_step(float (&acc)[S::kAccumulators], const AOperand& a,
                                              const uint8_t* b, int step, bool accumulate) {
  if constexpr (S::BN <= 256) {
    wgmma_step<S::BN, T, kAK, kBK>(acc, a, step_descriptor<kBK>(b, step), accumulate);
  } else {
    constexpr int kRest = S::BN - 256;
    auto& first = *reinterpret_cast<float(*)[128]>(acc);
    auto& rest = *reinterpret_cast<float(*)[kRest / 2]>(acc + 128);
    wgmma_step<256, T, kAK, kBK>(first, a, step_descriptor<kBK>(b, step), accumulate);
    wgmma_step<kRest, T, kAK, kBK>(rest, a, step_descriptor<kBK>(b + 256 * kRowBytes, step),
                                   accumulate);
  }
}

// tf32 wgmma's A fragment of step `step` from a consumer's 64 rows of an M-major float32 stage
// (kARegisters, hopper::load_m_major_tf32_fragment), rounded to the nearest tf32 as cuBLAS rounds
// (the tensor core would drop the low bits).
[[maybe_unused]] __device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4],
                                                                 const uint8_t* rows, int step) {
  hopper::load_m_major_tf32_fragment<kMajorBoxBytes<float>>(a, rows, step);
#pragma unroll
  for (int q = 0; q < 4; ++q) a[q] = mma::round_to_tf32(a[q]);
}

// A consumer warpgroup: for each tile, kRowBytes / kWgmmaKBytes multiply steps per stage into
// its 64 rows, at most one group in flight; a stage is handed back once the group that read it
// has completed. With A from registers (kARegisters), each step is its own group: the step loads
// its fragment once the wgmma that last read those registers, a stage earlier, has completed.
template <class S, typename T, bool kAK, bool kBK, int kCluster, class Epi>
__device__ void consume(int consumer, uint8_t* a_tiles, uint8_t* b_tiles, uint8_t* staging,
                        uint64_t* full, uint64_t* empty, const CUtensorMap* c_map, const Epi& epi,
                        T* c, int ldc, int M, int N, StepRange steps, ClusterPlace place) {
  constexpr int kSteps = kRowBytes / kWgmmaKBytes;
  const TileWalk<S, kCluster> walk(M, N);
  const bool warp_leader = threadIdx.x % 32 == 0;
  float acc[S::kAccumulators];
  [[maybe_unused]] uint32_t fragments[kSteps][4];
  int it = 0;
  for (int t = walk.first(); t < walk.cluster_tiles; t += walk.stride()) {
    const int2 origin = walk.origin(t, place.rank);
    if (origin.x >= M) {  // rows past M: the stages are only handed back, for the pair's B
      for (int ks = steps.begin; ks < steps.end; ++ks, ++it) {
        const int s = it % S::kStages;
        hopper::mbarrier_wait(&full[s], (it / S::kStages) & 1);
        if (warp_leader) release_stage<kCluster>(&empty[s], place);
      }
      continue;
    }
    int previous = 0;
    for (int ks = steps.begin; ks < steps.end; ++ks, ++it) {
      const int s = it % S::kStages;
      hopper::mbarrier_wait(&full[s], (it / S::kStages) & 1);
      const uint8_t* a = a_tiles + s * kATileBytes + consumer * 64 * kRowBytes;
      const uint8_t* b = b_tiles + s * S::kBTileBytes;
      if constexpr (kARegisters<T, kAK>) {
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          hopper::wgmma_wait<kSteps - 1>();  // the previous stage's step `step` has completed
          if (step == kSteps - 1 && ks > steps.begin && warp_leader) {
            release_stage<kCluster>(&empty[previous], place);  // and so all of its steps
          }
          load_a_fragment(fragments[step], a, step);
          hopper::fence_registers(acc);
          hopper::wgmma_fence();
          multiply_step<S, T, kAK, kBK>(acc, fragments[step], b, step,
                                        ks > steps.begin || step > 0);
          hopper::wgmma_commit();
        }
      } else {
        hopper::fence_registers(acc);
        hopper::wgmma_fence();
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          multiply_step<S, T, kAK, kBK>(acc, step_descriptor<kAK>(a, step), b, step,
                                        ks > steps.begin || step > 0);
        }
        hopper::wgmma_commit();
        hopper::wgmma_wait<1>();
        hopper::fence_registers(acc);
        if (ks > steps.begin && warp_leader) release_stage<kCluster>(&empty[previous], place);
      }
      previous = s;
    }
    hopper::wgmma_wait<0>();
    hopper::fence_registers(acc);
    if (warp_leader) release_stage<kCluster>(&empty[previous], place);
    if (gridDim.y > 1) {
      // The ring becomes the partial tile once neither consumer's wgmmas read it any more.
      hopper::named_barrier_sync(kConsumersBarrier, 128 * kConsumers);
      store_partial<S>(acc, reinterpret_cast<float*>(a_tiles), consumer);
    } else if constexpr (S::kTransposed) {
      if (c_map != nullptr) {
        store_tile_transposed_async<S, T>(acc, epi, staging, c_map, consumer,
                                          origin.x + consumer * 64, origin.y);
      } else {
        store_tile<S>(acc, epi, c, ldc, M, N, origin.x + consumer * 64, origin.y);
      }
    } else if (c_map != nullptr) {
      store_tile_async<S, T>(acc, epi, staging, c_map, consumer, origin.x + consumer * 64,
                             origin.y);
    } else {
      store_tile<S>(acc, epi, c, ldc, M, N, origin.x + consumer * 64, origin.y);
    }
  }
  // Shared memory must outlive the stores that read it; their writes to C complete with the grid.
  if (c_map != nullptr && threadIdx.x % 128 == 0) hopper::tma_store_wait_read<0>();
}

// kCluster: blocks per cluster along M (1 or 2), sharing each B tile through TMA multicast. With
// gridDim.y > 1, K is split too: the cluster is kCluster x gridDim.y blocks, one tile per group
// of kCluster, and split y takes steps_per_split K steps (the last one fewer); the splits add up
// their partial tiles through distributed shared memory.
// Epi (epilogue.cuh) maps each float32 sum of column n before it is rounded: linear's bias and
// activation, or nothing. C's rows are ldc elements apart (more than N for a slice of columns).
template <class S, typename T, bool kAK, bool kBK, int kCluster, class Epi>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(const __grid_constant__ CUtensorMap a_map,
                 const __grid_constant__ CUtensorMap a_tail_map,
                 const __grid_constant__ CUtensorMap b_map,
                 const __grid_constant__ CUtensorMap c_map, bool tma_store, Epi epi, T* c, int ldc,
                 int M, int N, int K, int steps_per_split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzled tiles must start on 1024-byte boundaries (the swizzle atom). The offset is
  // the same in every block, as multicast copies and remote arrivals need.
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  uint8_t* a_tiles = smem;
  uint8_t* b_tiles = a_tiles + S::kStages * kATileBytes;
  uint8_t* staging = b_tiles + S::kStages * S::kBTileBytes;  // one buffer per consumer
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + kConsumers * kStagingBytes);
  uint64_t* empty = full + S::kStages;
  const int k_steps = (K - 1) / BK<T> + 1;
  const int split = static_cast<int>(blockIdx.y), splits = static_cast<int>(gridDim.y);
  // Cluster ranks count along x first: the groups of kCluster blocks lie one per split.
  const ClusterPlace place{static_cast<int>(blockIdx.x) % kCluster, split * kCluster};
  const StepRange steps{split * steps_per_split, min(k_steps, (split + 1) * steps_per_split)};
  if (threadIdx.x == 0) {
    hopper::prefetch_tensor_map(&a_map);
    hopper::prefetch_tensor_map(&b_map);
    if (tma_store) hopper::prefetch_tensor_map(&c_map);
    for (int s = 0; s < S::kStages; ++s) {
      hopper::mbarrier_init(&full[s], 1);
      hopper::mbarrier_init(&empty[s], kCluster * kConsumers * 4);
    }
    hopper::fence_barrier_init();
  }
  // The other blocks of the cluster copy into this one and arrive on its barriers: they may
  // start only once its barriers exist.
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
    hopper::cluster_sync();
  }
  // Launched early (a programmatic dependent launch), the block has set up its shared memory
  // while the kernel before it finished; global memory is touched only from here on. All of this
  // grid's blocks are resident at once, so the next kernel may start placing its blocks on the
  // SMs that ours leave.
  hopper::wait_for_previous_grid();
  hopper::allow_next_grid();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    hopper::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      produce<S, T, kAK, kBK, kCluster>(&a_map, &a_tail_map, &b_map, a_tiles, b_tiles, full,
                                        empty, M, N, steps, place);
    }
  } else {
    hopper::setmaxnreg_inc<kConsumerRegs>();
    const int consumer = warpgroup - 1;
    consume<S, T, kAK, kBK, kCluster>(consumer, a_tiles, b_tiles,
                                      staging + consumer * kStagingBytes, full, empty,
                                      tma_store ? &c_map : nullptr, epi, c, ldc, M, N, steps,
                                      place);
  }
  if (splits > 1) {
    __syncwarp();            // the producer warp reconverges for the aligned barrier
    hopper::cluster_sync();  // every split's partial tile is written
    if (warpgroup > 0) {
      const TileWalk<S, kCluster> walk(M, N);
      sum_partials<S, kCluster>(reinterpret_cast<const float*>(a_tiles), epi, c, ldc, M, N,
                                walk.origin(walk.first(), place.rank), place.rank, split, splits);
    }
    __syncwarp();
    hopper::cluster_sync();  // and read: no block may exit while others read its tile
  }
  // No block may exit while another block of its cluster can still write into its shared memory.
  if constexpr (kCluster > 1) {
    __syncwarp();  // the producer warp reconverges for the aligned barrier
    hopper::cluster_sync();
  }
#endif
}

// ---- Host side --------------------------------------------------------------------------------

// The operand's tiles as the kernel expects them: K-major ones in one box of BK x rows per stage,
// M/N-major ones in boxes of kMajorBoxRows x BK.
template <class P>
CUtensorMap operand_map(const P& p, int64_t x_extent, int64_t K, int rows) {
  return P::k_contiguous ? tile_map(p.data, K, x_extent, p.ld, rows)
                         : tile_map(p.data, x_extent, K, p.ld, BK<typename P::scalar>);
}

// The kernel for problem G in tile shape S.
template <class S, int kCluster, class G, class Epi>
constexpr auto kernel_for() {
  return wgmma_kernel<ShapeFor<S, G>, typename G::scalar, decltype(G::a)::k_contiguous,
                      decltype(G::b)::k_contiguous, kCluster, Epi>;
}

// Launches the persistent grid: one block per SM (as many clusters as fit), never more blocks
// than tiles. Or, with steps_per_split short of all K steps, one block per tile and split, in
// clusters of kCluster x splits blocks.
template <class S0, int kCluster, class G, class Epi>
void launch(const G& g, const Epi& epi, int steps_per_split) {
  using S = ShapeFor<S0, G>;
  static_assert(S::BN / kCluster <= 256, "a K-major B share is one TMA box of at most 256 rows");
  using T = typename G::scalar;
  const CUtensorMap a_map = operand_map(g.a, g.M, g.K, BM);
  // The last tile row's rows inside M, for K-major A (see produce); unused otherwise.
  const int a_tail_rows = static_cast<int>(g.M % BM);
  const CUtensorMap a_tail_map = decltype(G::a)::k_contiguous && a_tail_rows > 0
                                     ? operand_map(g.a, g.M, g.K, a_tail_rows)
                                     : a_map;
  const CUtensorMap b_map = operand_map(g.b, g.N, g.K, S::BN / kCluster);
  // C rows must start on 16-byte boundaries for TMA to store them (g.c does: with_gemm's output,
  // or whole tiles of columns past it).
  // Transposed, C's rows are the tile's columns (g.N of them) and a box holds a round's rows.
  const bool tma_store = g.ldc % (16 / sizeof(T)) == 0;
  const CUtensorMap c_map =
      !tma_store       ? CUtensorMap{}
      : S::kTransposed ? tile_map<T>(g.c, g.M, g.N, g.ldc, S::template store_cols<T>())
                       : tile_map<T>(g.c, g.N, g.M, g.ldc, 64);
  auto* kernel = kernel_for<S0, kCluster, G, Epi>();
  allow_dynamic_smem(kernel, S::kSmemBytes);
  const int64_t cluster_tiles = tile_count<S, kCluster>(g.M, g.N);
  TORCH_CHECK(cluster_tiles * kCluster <= INT_MAX, "torch_mm_variants: output ", g.M, "x", g.N,
              " has too many tiles for one grid");
  const unsigned splits = ceil_div(k_steps_of(g), steps_per_split);
  if (splits > 1) {
    KernelLaunch split_launch(dim3(static_cast<unsigned>(cluster_tiles * kCluster), splits),
                              kThreads, S::kSmemBytes);
    split_launch.in_clusters(dim3(kCluster, splits)).starting_early(true);
    return split_launch.run(kernel, a_map, a_tail_map, b_map, c_map, tma_store, epi, g.c, g.ldc,
                            g.M, g.N, g.K, steps_per_split);
  }
  const int resident = resident_clusters(kernel, dim3(kCluster), kThreads, S::kSmemBytes);
  TORCH_CHECK(resident > 0, "torch_mm_variants: wgmma's thread-block clusters do not fit on ",
              device_properties(c10::cuda::current_device()).name);
  const int64_t clusters = std::min<int64_t>(cluster_tiles, resident);
  KernelLaunch persistent_launch(dim3(static_cast<unsigned>(clusters * kCluster)), kThreads,
                                 S::kSmemBytes);
  persistent_launch.in_clusters(dim3(kCluster)).starting_early(true);
  persistent_launch.run(kernel, a_map, a_tail_map, b_map, c_map, tma_store, epi, g.c, g.ldc, g.M,
                        g.N, g.K, steps_per_split);
}

// Full waves of `tiles` equal tiles, one per SM.
int64_t waves(int64_t tiles, int sms) { return (tiles + sms - 1) / sms; }

// The share of the SMs' time that `tiles` equal tiles keep busy, run in waves of one per SM.
double wave_efficiency(int64_t tiles, int sms) {
  return static_cast<double>(tiles) / static_cast<double>(waves(tiles, sms) * sms);
}

// Whether the output's tile rows pair up evenly. With an odd count, the last pair's second block
// has rows that all lie past M: it loads no A and multiplies nothing, but holds an SM to stream
// its share of B to its partner.
bool rows_pair_evenly(int64_t M) { return ceil_div(M, BM) % 2 == 0; }

// Blocks of tile shape S in pairs along M, the last pair's second block past M included.
template <class S>
int64_t paired_blocks(int64_t M, int64_t N) {
  return 2 * tile_count<S, 2>(M, N);
}

// K steps from which pairs of blocks repay their cluster's barriers over any waves (K = 4096,
// where K splits start to repay their adding too).
constexpr int kLongKSteps = 4096 / BK<uint16_t>;

// Whether pairs sharing B repay their cluster's barriers: over a long K (kLongKSteps steps or
// more), or where the tiles fill their waves (95%), which leaves L2 no bandwidth to spare. On
// the H100 (bf16) 128 x 192 tiles in pairs ran 1.0-1.4 times as fast as single blocks from
// K = 4096 (256-1536 rows against weights of 4096-28672 rows) and 0.99-1.08 times at K = 1024-3072
// over full waves, but 0.9-0.97 times over partial ones (1280 x 2048 x 2048, 2560 x 1024 x 1024,
// 2304^3, 1536^3); 128 x 128 tiles 0.88-0.9 times on 1280^3 (100 tiles).
bool pairing_pays(int64_t tiles, int64_t k_steps, int sms) {
  return k_steps >= kLongKSteps || wave_efficiency(tiles, sms) >= 0.95;
}

// Whether blocks of tile shape S pair along M to share B. Wide tiles pair wherever there are two
// tile rows and the pairs take no more waves than single blocks: sharing B pays for an idle last
// block (H100, bf16, unsplit, 320, 384 and 640 tokens: pairs 9-17% faster on a 14336-row weight
// and 11% at 640 on 11008 rows, at most 4% slower on 4096 rows), but not for a second wave (320
// and 384 tokens on 11008 rows: 129 single blocks in one wave against 172 paired ones; pairs
// 0.74 and 0.67 times as fast). MidTile (128 x 192, not transposed) pairs on the same terms where
// pairing_pays.
// Narrow ones, which read too little B per block for that, pair only where the rows pair up
// evenly (over 3 or 5 rows pairs ran from 0.91 to 1.23 times as fast as single blocks, slower at
// every weight at 384 tokens), and only where they fill more than half the SMs: with fewer
// blocks L2 has bandwidth to spare and sharing B saves nothing, while a cluster's barriers cost
// (H100, bf16, squares of 512-1024 with K = 512-3072: single blocks 1.02-1.26 times as fast; 128
// tiles on 512 x 4096: pairs 1.02-1.05 times as fast); and where pairing_pays.
template <class S>
bool pairs_along_m(int64_t M, int64_t N, int64_t k_steps, int sms) {
  constexpr bool kNarrow = std::is_same_v<S, NarrowTile>;
  // Wide, wider and token tiles read enough B per block that sharing it pays over any K.
  constexpr bool kPairsOnlyWherePaying = kNarrow || std::is_same_v<S, MidTile>;
  const int64_t tiles = tile_count<S>(M, N);
  const bool pairs_fit =
      kNarrow ? rows_pair_evenly(M) && 2 * tiles > sms
              : M > BM && waves(paired_blocks<S>(M, N), sms) <= waves(tiles, sms);
  return pairs_fit && (!kPairsOnlyWherePaying || pairing_pays(tiles, k_steps, sms));
}

// Estimated time, in waves of wide tiles, of an M x N output in tile shape S over all of K,
// paired where pairs_along_m says so. A tile of S has S::BN / WideTile::BN of a wide one's
// multiply-adds, taken as done at the same speed.
template <class S>
double tile_waves(int64_t M, int64_t N, int64_t k_steps, int sms) {
  const int64_t blocks =
      pairs_along_m<S>(M, N, k_steps, sms) ? paired_blocks<S>(M, N) : tile_count<S>(M, N);
  return static_cast<double>(waves(blocks, sms) * S::BN) / WideTile::BN;
}

// Launches tile shape S over all of K, in pairs along M that share B tiles or alone.
template <class S, class G, class Epi>
void launch_tiles(const G& g, const Epi& epi, bool paired) {
  const int all_steps = static_cast<int>(k_steps_of(g));
  if (paired) {
    launch<S, 2>(g, epi, all_steps);
  } else {
    launch<S, 1>(g, epi, all_steps);
  }
}

// Launches tile shape S over all of K, paired along M where pairs_along_m says so.
template <class S, class G, class Epi>
void launch_tiles(const G& g, const Epi& epi) {
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  launch_tiles<S>(g, epi, pairs_along_m<S>(g.M, g.N, k_steps_of(g), sms));
}

// A K split in one wave of blocks: its K steps per split, and its estimated time, the work of
// one block (tile columns times K steps), since all its blocks run at once.
struct KSplit {
  int per_split;
  double cost;
};

// K split over `groups` clusters of kCluster blocks of tile shape S, in the most splits (up to
// max_splits) whose clusters all fit at once; none where that leaves K whole.
template <class S, int kCluster, class G, class Epi>
std::optional<KSplit> k_split(const G& g, int64_t groups, int max_splits) {
  const int64_t k_steps = k_steps_of(g);
  const int per_split =
      steps_per_split(kernel_for<S, kCluster, G, Epi>(), kThreads, S::kSmemBytes, kCluster,
                      groups, k_steps, max_splits, kMinStepsPerSplit);
  if (per_split >= k_steps) return std::nullopt;
  return KSplit{per_split, static_cast<double>(per_split) * S::BN};
}

// K split over clusters of wide tiles, when the output's kCluster-block groups fill at most half
// the SMs and K is long (kMinStepsToSplit): the most splits (up to a cluster of
// kMaxClusterBlocks) whose clusters all fit at once.
template <int kCluster, class G, class Epi>
std::optional<KSplit> wide_split(const G& g, int sms) {
  const int64_t groups = tile_count<WideTile, kCluster>(g.M, g.N);
  if (2 * groups * kCluster > sms) return std::nullopt;
  return k_split<WideTile, kCluster, G, Epi>(g, groups, kMaxClusterBlocks / kCluster);
}

// The most splits of `tiles` single blocks that keep them within three quarters of the SMs (two
// at least), up to 8. On the H100 (bf16, K = 4096 and 8192, 128-384 tokens against 1024-4096
// weight rows) the best split count of narrow tiles was always within 5% of that one, which ran
// up to 1.45 times as fast as two splits and up to 1.3 times as fast as wide tiles split 8 ways;
// 128 blocks in clusters of 4 or 8 ran about as slow as two waves.
int split_limit(int64_t tiles, int sms) {
  return static_cast<int>(
      std::min<int64_t>(kMaxClusterBlocks, std::max<int64_t>(2, 3 * sms / (4 * tiles))));
}

// Narrow tiles split K where they fit on half the SMs, up to K = 8192, in split_limit splits.
template <class G, class Epi>
std::optional<KSplit> narrow_split(const G& g, int sms) {
  using S = NarrowTile;
  const int64_t tiles = tile_count<S>(g.M, g.N), k_steps = k_steps_of(g);
  if (k_steps > 2 * kMinStepsToSplit || 2 * tiles > sms) return std::nullopt;
  return k_split<S, 1, G, Epi>(g, tiles, split_limit(tiles, sms));
}

// 128 x 64 tiles split K where they fill between a quarter and half of the SMs, in split_limit
// splits. Taken in place of the narrow or wide tiles' split where a block has no more work (tile
// columns times K steps): on the H100 (bf16, nn.Linear layout, both timings of bench_skinny.py,
// two rounds), 128 tokens against 4096 weight rows and 256 against 2048 (64 tiles in 2 splits)
// ran 1.04-1.17 times as fast as the narrow or wide splits they replaced at K = 4096-14336,
// including where the two estimates tie (4096 x 14336: wide tiles in 8 splits) and the fewer
// splits cost less to add up.
template <class G, class Epi>
std::optional<KSplit> slim_split(const G& g, int sms) {
  const int64_t tiles = tile_count<SlimTile>(g.M, g.N);
  if (4 * tiles < sms || 2 * tiles > sms) return std::nullopt;
  return k_split<SlimTile, 1, G, Epi>(g, tiles, split_limit(tiles, sms));
}

// The nn.Linear product as C^T = W X^T (see TileShape): the weight as the M operand.
template <class G>
G transposed(const G& g) {
  static_assert(kTokenTiles<G>, "both operands K-contiguous: swapped, they keep their panel types");
  G t = g;
  t.a = g.b;
  t.b = g.a;
  t.M = g.N;
  t.N = g.M;
  return t;
}

// Transposed tiles of shape S over the transposed product t split K where there are at most
// `max_tiles` of them, in split_limit splits.
template <class S, class G, class Epi>
std::optional<KSplit> transposed_split(const G& t, int sms, int64_t max_tiles) {
  const int64_t tiles = tile_count<S>(t.M, t.N);
  if (tiles > max_tiles) return std::nullopt;
  return k_split<S, 1, G, Epi>(t, tiles, split_limit(tiles, sms));
}

// Split transposed tiles are estimated at this share of split wide tiles' speed: they read more
// shared memory per multiply-add (wgmma's N of 80-192 against 256), and their partial tiles
// are added over more splits. It is the share that sorts the H100's timings below.
constexpr double kTransposedSplitSpeed = 0.8;

// Takes the transposed product split in K where one of its tile shapes takes less time than
// `plan_cost`, that of the wide tiles' split the product would take otherwise: where the tokens
// fill their 80- to 192-column tiles better than 128-row tiles (in 4096 x 4096 x 320 the third
// tile row of x is half empty, two tiles of 160 are full), or where fewer weight tiles split K
// into more, shorter ranges. Tiles of 160 or 192 tokens split where they fit on half the SMs;
// those of 80 or 96 only where at least three splits fit (a quarter of the SMs), since each of
// their blocks reads its weight tile for fewer tokens. On the H100 (bf16, nn.Linear layout, two
// rounds, both timings of bench_skinny.py):
// - 160 and 192 tokens a tile ran 1.03-1.6 times as fast as the wide split they replaced at
//   160-352 tokens on weights of 1024-4096 rows with K = 4096-14336 (320 x 4096 x 14336: 0.66 to
//   0.85-0.99 of torch.mm back to back, 0.83 to 1.01 with L2 cleared), and from 2% to 34% slower
//   where the estimate without kTransposedSplitSpeed took them with a second tile of tokens at
//   most 80% full (224 and 256 tokens on 2048 and 4096 rows at K = 14336) or in 6 splits where
//   wide tiles split 8 ways (288 and 320 tokens on 1024 rows).
// - 80 and 96 tokens a tile, in 3-6 splits, ran 0.99-1.4 times as fast as the plans they
//   replaced at 160-288 tokens on 1024 rows and 160-192 tokens on 2048 rows at K = 14336
//   (224 x 1024 x 14336: 0.67 to 0.93 of torch.mm back to back, 0.73 to 0.86 with L2 cleared);
//   in 2 splits (2048 rows at 256-352 tokens) they took 1.05-1.23 times as long.
// Returns whether it launched.
template <class G, class Epi>
bool launch_transposed_split_if_faster(const G& g, const Epi& epi, int sms, double plan_cost) {
  const G t = transposed(g);
  const std::optional<KSplit> splits[] = {
      transposed_split<Tokens80Tile, G, Epi>(t, sms, sms / 4),
      transposed_split<Tokens96Tile, G, Epi>(t, sms, sms / 4),
      transposed_split<Tokens160Tile, G, Epi>(t, sms, sms / 2),
      transposed_split<Tokens192Tile, G, Epi>(t, sms, sms / 2)};
  int best = -1;
  for (int i = 0; i < 4; ++i) {
    if (splits[i] && (best < 0 || splits[i]->cost < splits[best]->cost)) best = i;
  }
  if (best < 0 || splits[best]->cost / kTransposedSplitSpeed >= plan_cost) return false;
  const int per_split = splits[best]->per_split;
  switch (best) {
    case 0:
      launch<Tokens80Tile, 1>(t, epi, per_split);
      break;
    case 1:
      launch<Tokens96Tile, 1>(t, epi, per_split);
      break;
    case 2:
      launch<Tokens160Tile, 1>(t, epi, per_split);
      break;
    default:
      launch<Tokens192Tile, 1>(t, epi, per_split);
  }
  return true;
}

// Outputs too small to keep the SMs busy over a long K split it: narrow tiles where
// narrow_split takes them, otherwise wide tiles (up to 8 splits; at K = 14336 narrow ones
// in two splits ran from 6% slower to 3% faster, and the wide tiles read less L2), paired where
// the rows pair up evenly: at 320 and 384 tokens, K = 14336, unpaired ones in two splits ran
// 1.3-1.8 times as fast as pairs in two or three. 128 x 64 tiles split instead where slim_split
// gives their blocks no more work. In the nn.Linear layout, transposed tiles split K in place of
// wide tiles where they take less time; they are weighed against wide tiles only, as they were
// measured, before the 128 x 64 tiles. Returns whether it launched.
template <class G, class Epi>
bool launch_split(const G& g, const Epi& epi, int sms) {
  if (k_steps_of(g) < kMinStepsToSplit) return false;
  const std::optional<KSplit> slim = slim_split<G, Epi>(g, sms);
  const auto launch_slim = [&] {
    launch<SlimTile, 1>(g, epi, slim->per_split);
    return true;
  };
  if (const std::optional<KSplit> narrow = narrow_split<G, Epi>(g, sms)) {
    if (slim && slim->cost <= narrow->cost) return launch_slim();
    launch<NarrowTile, 1>(g, epi, narrow->per_split);
    return true;
  }
  const bool pairs = rows_pair_evenly(g.M);
  const std::optional<KSplit> wide =
      pairs ? wide_split<2, G, Epi>(g, sms) : wide_split<1, G, Epi>(g, sms);
  if (!wide) return slim && launch_slim();
  if constexpr (kTokenTiles<G>) {
    if (launch_transposed_split_if_faster(g, epi, sms, wide->cost)) return true;
  }
  if (slim && slim->cost <= wide->cost) return launch_slim();
  if (pairs) {
    launch<WideTile, 2>(g, epi, wide->per_split);
  } else {
    launch<WideTile, 1>(g, epi, wide->per_split);
  }
  return true;
}

// Columns [n0, g.N) of g's product: B's and C's columns from n0 on, C's rows still g.ldc apart
// (stored transposed, C's rows from n0 on).
template <class G>
G columns_from(G g, int n0) {
  g.b = g.b.from(n0);
  g.c += kStoresTransposed<G> ? static_cast<int64_t>(n0) * g.ldc : n0;
  g.N -= n0;
  return g;
}

// Estimated time of launch_split_tail's second launch and of adding its splits, in waves of wide
// tiles at K >= 4096 (fitted to the H100 times below); it grows as K, and so a wave, shortens.
constexpr double kSplitTailCost = 0.2;

// Outputs of a few waves of wide tiles whose last wave leaves most SMs idle (e.g. 640 x 14336:
// 280 tiles, a third wave of 16 on 132 SMs). The tile columns that fill whole waves run as they
// are (paired where the rows pair up evenly); the other columns, few enough tiles to split K at
// least two ways on the SMs, then take a fraction of a wave in a second launch. Taken when its
// estimated time, in waves of wide tiles, beats that of the plan the output would take
// otherwise. On the H100 (bf16, nn.Linear weights) against those plans: 1.2x at 320 and 640
// tokens on a 14336 x 4096 weight, 1.27x at 640 on 28672 x 8192, 1.05-1.08x at 384 and 1536
// tokens, and 1.06x on 3072^3.
struct SplitTail {
  int n0;         // the columns of the second launch: [n0, N)
  int per_split;  // its K steps per split
  double waves;   // the estimated time of both launches
};

// The split tail of g's product, if it has one: whole waves and at least two splits of the rest.
template <class G, class Epi>
std::optional<SplitTail> split_tail(const G& g, int sms) {
  using S = WideTile;
  const int64_t rows = ceil_div(g.M, BM), columns = ceil_div(g.N, S::BN);
  const int64_t full_waves = rows * columns / sms, head_columns = full_waves * sms / rows;
  if (head_columns == 0 || head_columns >= columns) return std::nullopt;
  const int64_t tail_tiles = (columns - head_columns) * rows, k_steps = k_steps_of(g);
  const int per_split =
      steps_per_split(kernel_for<S, 1, G, Epi>(), kThreads, S::kSmemBytes, 1, tail_tiles,
                      k_steps, kMaxClusterBlocks, kMinStepsPerSplit);
  const int64_t splits = ceil_div(k_steps, per_split);
  if (splits < 2) return std::nullopt;
  const double tail_cost =
      kSplitTailCost * std::max(1.0, static_cast<double>(kMinStepsToSplit) / k_steps);
  return SplitTail{static_cast<int>(head_columns * S::BN), per_split,
                   full_waves + 1.0 / splits + tail_cost};
}

// Launches the split tail: columns [0, n0) in whole waves, then the rest split in K.
template <class G, class Epi>
void launch_split_tail(const G& g, const Epi& epi, const SplitTail& tail) {
  G head = g;
  head.N = tail.n0;
  launch_tiles<WideTile>(head, epi, rows_pair_evenly(g.M));
  // Stored transposed, the columns of g are C's rows: epi keeps C's columns.
  const Epi tail_epi = kStoresTransposed<G> ? epi : epi.from_column(tail.n0);
  launch<WideTile, 1>(columns_from(g, tail.n0), tail_epi, tail.per_split);
}

// The nn.Linear product computed transposed, C^T = W X^T, in tile shape S over all of K.
template <class S, class G, class Epi>
void launch_transposed(const G& g, const Epi& epi) {
  launch_tiles<S>(transposed(g), epi);
}

// Takes the transposed product where one of its tile shapes beats `plan_waves`, the estimate
// of the best plan otherwise. H100, bf16, 160-704 tokens on weights of 4096-28672 rows, every
// plan forced in turn: the plan changed on 19 of 45 shapes, 17 of them 1.04-1.37x as fast (0.69
// to 0.93 of torch.mm at 320 x 14336 x 4096, 0.72 to 0.90 at 576 x 14336 x 4096) and two slower
// (0.94x at 448 x 14336 x 4096, three waves of 160-token tiles against two of wide pairs; 0.97x
// at 704 x 28672 x 4096); over all 45 the choice ran within 1.7% of the fastest plan on average.
// Estimating transposed tiles at nine tenths of the speed, as narrow ones, fit worse (2.6%).
// Returns whether it launched.
template <class G, class Epi>
bool launch_transposed_if_faster(const G& g, const Epi& epi, int sms, double plan_waves) {
  // Transposed, the weight's rows are the M of 128-row tiles and the tokens their N.
  const double t160 = tile_waves<Tokens160Tile>(g.N, g.M, k_steps_of(g), sms);
  const double t192 = tile_waves<Tokens192Tile>(g.N, g.M, k_steps_of(g), sms);
  if (std::min(t160, t192) >= plan_waves) return false;
  if (t160 <= t192) {
    launch_transposed<Tokens160Tile>(g, epi);
  } else {
    launch_transposed<Tokens192Tile>(g, epi);
  }
  return true;
}

// Whether narrow tiles in one wave fill enough of the SMs to run unsplit: 80% of them, or 70%
// counting only the rows that hold data. On the H200 (bf16) 384 tokens on 4096- and 4352-row
// weights (96 and 102 tiles, 73% and 77% of the SMs) ran 1.01-1.2 times as fast unsplit as split
// over wide tiles, from K = 4096 to 14336; at 320 tokens, whose last tile row is half empty,
// splits stayed up to 1.2 times as fast.
bool narrow_tiles_fill(int64_t M, int64_t N, int sms) {
  const int64_t tiles = tile_count<NarrowTile>(M, N);
  const double rows_with_data = static_cast<double>(M) / BM;
  const double data_fill = rows_with_data * static_cast<double>(ceil_div(N, NarrowTile::BN)) / sms;
  return tiles <= sms && (wave_efficiency(tiles, sms) >= 0.8 || data_fill >= 0.7);
}

// Whether 128 x 64 tiles in one wave take the output over all of K where narrow tiles would split
// it: where the tiles holding data fill 70% of the SMs and K is at most kMinStepsToSplit steps, or
// the output has one tile row. A split's partial tiles cost more to add up than such short K
// ranges save. On the H100 (bf16, nn.Linear layout, both timings of bench_skinny.py, two rounds)
// they ran 1.0-1.15 times as fast as the splits they replaced at 192-256 tokens against 4096
// weight rows, 384-512 against 2048 and 768 against 1024 (K = 4096), and at 128 tokens against
// 8192 rows up to K = 14336; over longer K with more tile rows, up to 1.3 times as long.
bool slim_tiles_fill(int64_t M, int64_t N, int64_t k_steps, int sms) {
  const int64_t tiles = tile_count<SlimTile>(M, N);
  const double data_tiles =
      static_cast<double>(M) / BM * static_cast<double>(ceil_div(N, SlimTile::BN));
  const bool short_k = k_steps <= kMinStepsToSplit;
  return tiles <= sms && data_tiles >= 0.7 * sms && (short_k || M <= BM);
}

// Whether the nn.Linear product runs transposed in one wave of 128 x S::BN tiles (the weight's rows
// by S::BN tokens), unpaired, over all of K: where those tiles fill 70% of the SMs and the tokens
// fill their tiles (min_fill), and the product would otherwise split a K of at most
// kMinStepsToSplit steps, or run narrow tiles in one wave (whose blocks have more work) over at
// most twice that.
// On the H100 (bf16, nn.Linear layout, both timings, two rounds) 96-token tiles took 0.80-1.00 of
// the time of the plans they replaced (0.94 on average) at 288-1536 tokens against weights of
// 1024-4096 rows, K = 1024-8192 (384 x 4096 x 4096: 0.76x to 0.82x of torch.mm back to back, 0.88x
// to 0.92x with L2 cleared), but 0.99-1.05 at K = 14336. Pairs sharing the tokens' tile ran slower
// than single blocks (L2 holds the tokens), and 96-token tiles whose last one holds a third of
// its tokens (320) lost to the plans they would replace.
template <class S>
bool token_tiles_fill(int64_t M, int64_t N, int64_t k_steps, int sms, double min_fill = 0.95) {
  static_assert(S::kTransposed, "token tiles hold tokens in their columns");
  const int64_t token_tiles = ceil_div(M, S::BN), tiles = token_tiles * ceil_div(N, BM);
  const bool tokens_fill = M >= min_fill * static_cast<double>(token_tiles * S::BN);
  const bool replaces_split = k_steps <= kMinStepsToSplit;
  const bool replaces_narrow = k_steps <= 2 * kMinStepsToSplit && narrow_tiles_fill(M, N, sms);
  return tiles <= sms && tiles >= 0.7 * sms && tokens_fill && (replaces_split || replaces_narrow);
}

// Whether one wave of 80-token tiles, 97% full, takes a product that 96-token tiles do not: where
// neither narrow (128 x 128) nor 128 x 64 tiles fill the wave. On the H100 (bf16, nn.Linear
// layout, both timings, two rounds) 80-token tiles took 0.78-1.00 of the time of the plans they
// replaced at 80-1040 tokens against weights of 1024-14336 rows (K = 1024-4096; 320 x 4096 x 4096:
// 0.75x to 0.80x of torch.mm back to back; 720 x 1536 x 4096: 0.56x to 0.72x), and 0.89-0.94 with
// L2 cleared but 1.01-1.05 back to back at 312 and 624 tokens (the last tile partly empty). They
// took 1.07-1.08 where they replaced narrow tiles (160 x 8192 x 4096), 1.01-1.23 where they would
// replace 128 x 64 tiles (240 tokens on 4096 rows, 480 on 2048), and 1.05-1.08 at 608 tokens on
// 2048 rows, whose tiles are 95% full.
bool eighty_token_wave_takes(int64_t M, int64_t N, int64_t k_steps, int sms) {
  return !narrow_tiles_fill(M, N, sms) && !slim_tiles_fill(M, N, k_steps, sms) &&
         token_tiles_fill<Tokens80Tile>(M, N, k_steps, sms, 0.97);
}

// Launches the nn.Linear product transposed in one wave of token tiles S, unpaired, over all of K.
template <class S, class G, class Epi>
void launch_token_wave(const G& g, const Epi& epi) {
  launch<S, 1>(transposed(g), epi, static_cast<int>(k_steps_of(g)));
}

// The tile shapes of outputs run in whole tiles over all of K.
enum class Tiles { kNarrow, kMid, kWide, kWider };

// A plan of whole tiles and its estimated time, in waves of wide tiles.
struct TilePlan {
  Tiles tiles;
  double waves;
};

// 128 x 192 tiles are taken at this share of wide tiles' speed: paired, they read a sixth more L2
// per multiply-add. On the H100 (bf16, 5376^3 to 8192^3, where their waves take 2-4% less SM time
// than wide ones') they ran 0.97-1.03 times as fast as wide tiles.
constexpr double kMidSpeed = 0.95;

// Wide tiles, unless narrow ones fill the SMs enough better to make up for reading more of L2 per
// multiply-add (taken as a tenth of their speed), or wider ones (128 x 320, pairs only) take less
// SM time in whole waves: they read a tenth less L2 per multiply-add than wide ones, which gained
// 2-4% on 4096 x 14336 x 4096 (H200), but 4096 columns make 12.8 of them a row, and on 4096^3 the
// rows' 13th tiles cost a fifth wave. Then 128 x 192 tiles where their waves take no more SM time
// than narrow ones' (they do the same work with less L2 and fewer stores per multiply-add), or
// less than wide or wider ones' at kMidSpeed. On the H100 (bf16, both row-major and nn.Linear
// layouts) they ran 1.03-1.3 times as fast as the plans they replaced on squares of 1536-4352
// and on 256-3072 rows against weights of 2048-28672 x 1024-14336, and from 2% slower to 2%
// faster where they replaced transposed tiles or a split tail.
TilePlan whole_tile_plan(int64_t M, int64_t N, int64_t k_steps, int sms) {
  const int64_t narrow_tiles = tile_count<NarrowTile>(M, N);
  const int64_t wide_tiles = tile_count<WideTile>(M, N);
  const int64_t wider_time = waves(paired_blocks<WiderTile>(M, N), sms) * WiderTile::BN;
  const int64_t wide_time = waves(wide_tiles, sms) * WideTile::BN;
  TilePlan plan{Tiles::kWide, static_cast<double>(wide_time) / WideTile::BN};
  if (0.9 * wave_efficiency(narrow_tiles, sms) > wave_efficiency(wide_tiles, sms)) {
    // A narrow tile has half a wide one's multiply-adds, done at nine tenths of its speed, or at
    // its speed in pairs sharing B (H100: split tails ran up to a tenth slower than paired narrow
    // tiles estimated at nine tenths).
    const double narrow_wave = pairs_along_m<NarrowTile>(M, N, k_steps, sms) ? 0.5 : 0.5 / 0.9;
    plan = {Tiles::kNarrow, waves(narrow_tiles, sms) * narrow_wave};
  } else if (M > BM && wider_time < wide_time) {
    plan = {Tiles::kWider, static_cast<double>(wider_time) / WideTile::BN};
  }
  const double mid_waves = tile_waves<MidTile>(M, N, k_steps, sms);
  const bool take_mid = plan.tiles == Tiles::kNarrow ? mid_waves <= plan.waves
                                                     : mid_waves < kMidSpeed * plan.waves;
  return take_mid ? TilePlan{Tiles::kMid, mid_waves} : plan;
}

// Launches g's product in whole tiles of the given shape over all of K.
template <class G, class Epi>
void launch_whole_tiles(const G& g, const Epi& epi, Tiles tiles) {
  switch (tiles) {
    case Tiles::kNarrow:
      return launch_tiles<NarrowTile>(g, epi);
    case Tiles::kMid:
      return launch_tiles<MidTile>(g, epi);
    case Tiles::kWide:
      return launch_tiles<WideTile>(g, epi);
    case Tiles::kWider:
      return launch<WiderTile, 2>(g, epi, static_cast<int>(k_steps_of(g)));
  }
}

// In the nn.Linear layout, one wave of transposed 96-token tiles where token_tiles_fill says so,
// or else of 80-token tiles where eighty_token_wave_takes does.
// Narrow tiles that fill most SMs in one wave run unsplit (e.g. up to 128 tokens against a
// 14336-row weight: 6-9% faster than wide tiles split two ways, H100), then 128 x 64 tiles where
// slim_tiles_fill says so. Then outputs that leave at least half the SMs without a wide tile split
// K (launch_split). Outputs that fit one wave of 128 x 64 tiles run in those, unpaired: more SMs
// share the few K steps of a small product (H100, bf16, outputs of one such wave: squares of
// 256-1024, and 128-768 rows against 1024-8192 columns at K = 1024-2048, 1.06-1.21 times as fast as
// narrow tiles; 64 x 8192 x 2048 even; pairs were slower still). Otherwise whole_tile_plan, or its
// split tail where that takes less time, or last, in the nn.Linear layout, transposed tiles where
// their waves take less SM time than either (launch_transposed_if_faster).
template <class G, class Epi = NoEpilogue>
void launch(const G& g, const Epi& epi = {}) {
  const int sms = device_properties(c10::cuda::current_device()).multiProcessorCount;
  const int64_t k_steps = k_steps_of(g);
  if constexpr (kTokenTiles<G>) {
    if (token_tiles_fill<Tokens96Tile>(g.M, g.N, k_steps, sms)) {
      return launch_token_wave<Tokens96Tile>(g, epi);
    }
    if (eighty_token_wave_takes(g.M, g.N, k_steps, sms)) {
      return launch_token_wave<Tokens80Tile>(g, epi);
    }
  }
  if (narrow_tiles_fill(g.M, g.N, sms)) return launch_tiles<NarrowTile>(g, epi);
  if (slim_tiles_fill(g.M, g.N, k_steps, sms)) return launch_tiles<SlimTile>(g, epi, false);
  if (launch_split(g, epi, sms)) return;
  if (tile_count<SlimTile>(g.M, g.N) <= sms) return launch_tiles<SlimTile>(g, epi, false);
  const TilePlan plan = whole_tile_plan(g.M, g.N, k_steps, sms);
  const std::optional<SplitTail> tail = split_tail<G, Epi>(g, sms);
  const bool take_tail = tail && tail->waves < plan.waves;
  if constexpr (kTokenTiles<G>) {
    if (launch_transposed_if_faster(g, epi, sms, take_tail ? tail->waves : plan.waves)) return;
  }
  if (take_tail) return launch_split_tail(g, epi, *tail);
  launch_whole_tiles(g, epi, plan.tiles);
}

// Calls f(c10::Half{}), f(c10::BFloat16{}) or f(float{}) for the input dtype.
template <typename F>
void dispatch_wgmma_dtype(at::ScalarType dtype, F&& f) {
  if (dtype == at::kFloat) return f(float{});
  dispatch_16bit(dtype, f);
}

// Whether this rung multiplies operands of a dtype and layout that TMA can address (16-byte
// aligned): 16-bit ones in any layout, float32 in TF32 where the user allows it for matmuls
// (torch.backends.cuda.matmul.allow_tf32, as torch.mm) and where A or B is K-major. tf32 wgmma
// reads K-major tiles from shared memory and takes A from registers in any layout: B K-major
// runs as it is, a row-major B against a row-major A transposed (stored_transposed).
bool wgmma_takes(bool float32, bool a_k_major, bool b_k_major, bool tma_aligned) {
  if (!float32) return tma_aligned;
  return tma_aligned && (a_k_major || b_k_major) && at::globalContext().allowTF32CuBLAS();
}

// float32's row-major product C = A B as C^T = B^T A^T, stored transposed: B [K, N] (N-major)
// becomes the M-major A that goes to wgmma from registers, A [M, K] the K-major B.
template <typename T>
StoredTransposed<Gemm<T, false, true>> stored_transposed(const Gemm<T, true, false>& g) {
  StoredTransposed<Gemm<T, false, true>> t;
  t.a = {g.b.data, g.b.ld};
  t.b = {g.a.data, g.a.ld};
  t.c = g.c;
  t.M = g.N;
  t.N = g.M;
  t.K = g.K;
  t.ldc = g.ldc;
  return t;
}

// The operand that float32 in TF32 copies K-major first where neither is: a stored transposed
// (M-contiguous) against a row-major b (N-contiguous), as a weight's gradient dy.t() @ x is.
// tf32 wgmma reads K-major tiles only. The smaller one is copied (a at a tie, and always where
// b is a single column, which stays N-major), if the other one and the copy's rows (K floats)
// are aligned for TMA; the product then runs in one of the layouts above. On an H200 (copy
// included, torch.mm beside, wgmma.md has the table) that ran 1.03-1.18x as fast as torch.mm from
// 4096^3 up and 0.66-0.90x on squares of 256-2048, where rung 8 in place ran 0.74-0.77x and
// 0.37-0.82x.
enum class KMajorCopy { kNone, kA, kB };

KMajorCopy k_major_copy(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != at::kFloat || !at::globalContext().allowTF32CuBLAS()) {
    return KMajorCopy::kNone;
  }
  if (is_row_major(a) || !is_col_major(a) || !is_row_major(b)) return KMajorCopy::kNone;
  const bool copy_a = a.numel() <= b.numel() || b.size(1) == 1;
  const Operand<float> kept = operand_of<float>(copy_a ? b : a);
  if (a.size(1) % 4 != 0 || !vector_aligned(kept, 16)) return KMajorCopy::kNone;
  return copy_a ? KMajorCopy::kA : KMajorCopy::kB;
}

// t copied row-major, or nothing where the allocator has no memory left for it: the copy is
// memory the product itself does not need, and rung 8 can multiply the operands in place instead
// of the call failing.
std::optional<at::Tensor> row_major_copy_if_memory(const at::Tensor& t) {
  try {
    return t.contiguous();
  } catch (const c10::OutOfMemoryError&) {
    return std::nullopt;
  }
}

// Calls f(gemm) for out = a @ b where wgmma_takes the operands (float32's row-major product
// transposed, and where neither operand is K-major one copied first: k_major_copy); other views
// and layouts go to rung 8 (`fallback(tensor_core)`), never to a copy engine fault. Rung 8 runs
// float32 in TF32 or, with TF32 off, in 3xTF32.
template <typename F, typename Fallback>
void with_tma_gemm(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, F&& f,
                   Fallback&& fallback) {
  const KMajorCopy copy = k_major_copy(a, b);
  if (copy != KMajorCopy::kNone) {
    const bool copy_a = copy == KMajorCopy::kA;
    // b is copied as b^T row-major, i.e. b column-major (K-contiguous)
    const std::optional<at::Tensor> copied = row_major_copy_if_memory(copy_a ? a : b.t());
    if (!copied) return fallback(find_algorithm(a.device(), "tensor_core"));
    return copy_a ? with_tma_gemm(*copied, b, out, f, fallback)
                  : with_tma_gemm(a, copied->t(), out, f, fallback);
  }
  dispatch_wgmma_dtype(a.scalar_type(), [&](auto dtype) {
    using T = decltype(dtype);
    with_gemm<T>(a, b, out, [&](auto g) {
      using G = decltype(g);
      constexpr bool kFloat32 = std::is_same_v<T, float>;
      constexpr bool kAKMajor = decltype(G::a)::k_contiguous;
      constexpr bool kBKMajor = decltype(G::b)::k_contiguous;
      if constexpr (!kFloat32 || kAKMajor || kBKMajor) {
        if (wgmma_takes(kFloat32, kAKMajor, kBKMajor, g.a.aligned(16) && g.b.aligned(16))) {
          if constexpr (kFloat32 && !kBKMajor) {
            return f(stored_transposed(g));
          } else {
            return f(g);
          }
        }
      }
      fallback(find_algorithm(a.device(), "tensor_core"));
    });
  });
}

void wgmma(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  with_tma_gemm(
      a, b, out, [](const auto& g) { launch(g); },
      [&](const Algorithm& rung8) { rung8.run(a, b, out); });
}

// linear's epilogue, fused for the nn.Linear layout (x row-major, w.t() column-major: both
// K-contiguous) when the epilogue is cheap: a bias and relu ride along with the stores for free,
// but erf, tanh and exp on every sum hold up the tensor cores longer than a separate pass over
// the output takes. Otherwise the plain kernel and the epilogue from ATen.
void wgmma_fused(const at::Tensor& a, const at::Tensor& b, const Epilogue& epilogue,
                 at::Tensor& out) {
  const auto fused = [&](const auto& g) {
    using G = std::decay_t<decltype(g)>;
    using T = typename G::scalar;
    constexpr bool kLinearLayout = kBothKMajor<G>;
    const T* bias = epilogue.bias.defined() ? static_cast<const T*>(epilogue.bias.data_ptr())
                                            : nullptr;
    const int columns = epilogue.bias.defined() ? static_cast<int>(epilogue.bias.size(0)) : 0;
    if constexpr (kLinearLayout) {
      if (epilogue.activation == Activation::kNone) {
        return launch(g, BiasActivation<T, Activation::kNone>{bias, columns});
      }
      if (epilogue.activation == Activation::kRelu) {
        return launch(g, BiasActivation<T, Activation::kRelu>{bias, columns});
      }
    }
    launch(g);
    apply_epilogue(epilogue, out);
  };
  with_tma_gemm(a, b, out, fused,
                [&](const Algorithm& rung8) { rung8.run_fused(a, b, epilogue, out); });
}

// Whether auto passes float32 inputs on to rung 8, which would run them anyway (with_tma_gemm),
// and which takes a whole bmm batch in one launch. Operands with general strides, which
// with_gemm copies first, count as run there too.
bool float32_runs_on_rung8(const at::Tensor& a, const at::Tensor& b, int64_t /*entries*/) {
  if (a.scalar_type() != at::kFloat || k_major_copy(a, b) != KMajorCopy::kNone) return false;
  const auto unit_stride = [](const at::Tensor& t) { return is_row_major(t) || is_col_major(t); };
  if (!unit_stride(a) || !unit_stride(b)) return true;
  const Operand<float> A = operand_of<float>(a), B = operand_of<float>(b);
  return !wgmma_takes(true, !A.col_major, B.col_major,
                      vector_aligned(A, 16) && vector_aligned(B, 16));
}

MM_VARIANTS_REGISTER({"wgmma", c10::kCUDA, 9, {at::kHalf, at::kBFloat16, at::kFloat}, &wgmma,
                      &sm90a, nullptr, "", /*auto_candidate=*/true, &wgmma_fused, nullptr,
                      &float32_runs_on_rung8});

}  // namespace
}  // namespace mm_variants::cuda
