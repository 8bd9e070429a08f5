// The gather/scatter copy kernel, as PTX the driver compiles for the GPU at hand.
//
//   CUmodule m;  cuModuleLoadData(&m, kCopyPiecesPtx);
//   CUfunction f; cuModuleGetFunction(&f, m, kCopyPiecesKernel);
//   CopyKernelArgs a = CopyKernelArgs::Pieces(device_pieces, count);
//   cuLaunchKernel(f, ctas, 1, 1, kCopyPiecesThreads, 1, 1, 0, stream, a.params().data(), nullptr);
//
// One pass moves many scattered pieces: each CTA takes pieces in a grid-stride loop and
// its threads copy 16-byte vectors (four loads in flight per thread), then any
// unaligned tail byte by byte. Source and destination may be on different GPUs (UVA
// pointers with peer access), so a KV-block gather across NVLink is one launch. It is
// hand-written PTX rather than CUDA C so that building ferryd needs no nvcc.
//
// The pieces come from a list (CopyPiece, one per piece) or, for paged writes, from the
// blocks form: one block mapping (CopyBlockOffsets, one per block) applied to several
// parts (CopyBlockPart: a layer's base addresses), which the kernel expands itself, so
// that the host neither builds nor uploads a list of every block of every layer.
#ifndef FERRY_AGENT_CUDA_COPY_KERNEL_H_
#define FERRY_AGENT_CUDA_COPY_KERNEL_H_

#include <array>
#include <cstdint>

namespace ferry {

// What the kernel reads, one per piece, in device memory.
struct CopyPiece {
  uint64_t src;
  uint64_t dst;
  uint64_t length;
};
static_assert(sizeof(CopyPiece) == 24, "the PTX reads 24-byte pieces");

// The blocks form: block b of part p copies block_size bytes from parts[p].src +
// offsets[b].src to parts[p].dst + offsets[b].dst. Both arrays in device memory.
struct CopyBlockPart {
  uint64_t src;
  uint64_t dst;
};
struct CopyBlockOffsets {
  uint64_t src;
  uint64_t dst;
};
static_assert(sizeof(CopyBlockPart) == 16 && sizeof(CopyBlockOffsets) == 16, "the PTX reads 16-byte entries");

extern const char kCopyPiecesPtx[];
inline constexpr char kCopyPiecesKernel[] = "ferry_copy_pieces";
inline constexpr unsigned kCopyPiecesThreads = 512;
// Chunks are cut into pieces of at most this many bytes, so that a big chunk spreads
// over many CTAs (a CTA copies one piece at a time).
inline constexpr uint64_t kCopyPieceBytes = 32 << 10;
static_assert(kCopyPieceBytes == 1 << 15, "the PTX's blocks form shifts a piece index by 15");

// The kernel's parameters, in its order; cuLaunchKernel takes params().data().
struct CopyKernelArgs {
  uint64_t pieces = 0;   // a CopyPiece list; 0 for the blocks form
  uint32_t count = 0;    // pieces, or parts * blocks * pieces_per_block
  uint64_t parts = 0;    // blocks form: CopyBlockPart[parts]
  uint64_t offsets = 0;  // blocks form: CopyBlockOffsets[blocks]
  uint32_t blocks = 0;
  uint32_t pieces_per_block = 0;  // ceil(block_size / kCopyPieceBytes)
  uint64_t block_size = 0;

  static CopyKernelArgs Pieces(uint64_t list, uint32_t count) {
    CopyKernelArgs a;
    a.pieces = list;
    a.count = count;
    return a;
  }
  // The caller checks that parts * blocks * pieces_per_block fits in 32 bits (BlocksFit).
  static CopyKernelArgs Blocks(uint64_t parts, uint32_t part_count, uint64_t offsets, uint32_t blocks,
                               uint64_t block_size) {
    CopyKernelArgs a;
    a.parts = parts;
    a.offsets = offsets;
    a.blocks = blocks;
    a.block_size = block_size;
    a.pieces_per_block = static_cast<uint32_t>(PiecesPerBlock(block_size));
    a.count = part_count * blocks * a.pieces_per_block;
    return a;
  }
  static bool BlocksFit(uint64_t part_count, uint64_t blocks, uint64_t block_size) {
    const uint64_t per_block = PiecesPerBlock(block_size);
    return per_block < (1ull << 31) && blocks < (1ull << 31) && part_count < (1ull << 31) &&
           part_count * blocks < (1ull << 31) && part_count * blocks * per_block < (1ull << 31);
  }
  static uint64_t PiecesPerBlock(uint64_t block_size) { return (block_size + kCopyPieceBytes - 1) / kCopyPieceBytes; }
  std::array<void*, 7> params() { return {&pieces, &count, &parts, &offsets, &blocks, &pieces_per_block, &block_size}; }
};

}  // namespace ferry

#endif  // FERRY_AGENT_CUDA_COPY_KERNEL_H_
