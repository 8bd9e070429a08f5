// The gather/scatter copy kernel, as PTX the driver compiles for the GPU at hand.
//
//   CUmodule m;  cuModuleLoadData(&m, kCopyPiecesPtx);
//   CUfunction f; cuModuleGetFunction(&f, m, kCopyPiecesKernel);
//   void* args[] = {&device_pieces, &count};
//   cuLaunchKernel(f, blocks, 1, 1, kCopyPiecesThreads, 1, 1, 0, stream, args, nullptr);
//
// One pass moves many scattered pieces: each CTA takes pieces in a grid-stride loop and
// its threads copy 16-byte vectors (four loads in flight per thread), then any
// unaligned tail byte by byte. Source and destination may be on different GPUs (UVA
// pointers with peer access), so a KV-block gather across NVLink is one launch. It is
// hand-written PTX rather than CUDA C so that building ferryd needs no nvcc.
#ifndef FERRY_AGENT_CUDA_COPY_KERNEL_H_
#define FERRY_AGENT_CUDA_COPY_KERNEL_H_

#include <cstdint>

namespace ferry {

// What the kernel reads, one per piece, in device memory.
struct CopyPiece {
  uint64_t src;
  uint64_t dst;
  uint64_t length;
};
static_assert(sizeof(CopyPiece) == 24, "the PTX reads 24-byte pieces");

extern const char kCopyPiecesPtx[];
inline constexpr char kCopyPiecesKernel[] = "ferry_copy_pieces";
inline constexpr unsigned kCopyPiecesThreads = 512;
// Chunks are cut into pieces of at most this many bytes, so that a big chunk spreads
// over many CTAs (a CTA copies one piece at a time).
inline constexpr uint64_t kCopyPieceBytes = 32 << 10;

}  // namespace ferry

#endif  // FERRY_AGENT_CUDA_COPY_KERNEL_H_
