#include "agent/cuda/copy_kernel.h"

namespace ferry {

// ferry_copy_pieces(CopyKernelArgs): one piece per grid-stride step, read from the list
// (pieces != 0) or computed from the blocks form.
const char kCopyPiecesPtx[] = R"PTX(
.version 7.0
.target sm_70
.address_size 64

.visible .entry ferry_copy_pieces(
  .param .u64 pieces,
  .param .u32 count,
  .param .u64 parts,
  .param .u64 offsets,
  .param .u32 blocks,
  .param .u32 pieces_per_block,
  .param .u64 block_size
)
{
  .reg .pred %p<5>;
  .reg .b16 %h<2>;
  .reg .b32 %r<32>;
  .reg .b64 %rd<32>;

  ld.param.u64 %rd1, [pieces];
  setp.eq.u64 %p4, %rd1, 0;         // the blocks form
  cvta.to.global.u64 %rd1, %rd1;
  ld.param.u32 %r1, [count];
  ld.param.u64 %rd19, [parts];
  cvta.to.global.u64 %rd19, %rd19;
  ld.param.u64 %rd20, [offsets];
  cvta.to.global.u64 %rd20, %rd20;
  ld.param.u32 %r22, [blocks];
  ld.param.u32 %r23, [pieces_per_block];
  ld.param.u64 %rd21, [block_size];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %nctaid.x;
  mov.u32 %r4, %tid.x;
  mov.u32 %r5, %ntid.x;
  cvt.u64.u32 %rd2, %r4;            // tid
  cvt.u64.u32 %rd3, %r5;            // threads
  shl.b64 %rd4, %rd3, 4;            // vstep = threads * 16
  shl.b64 %rd12, %rd4, 2;           // 4 * vstep
  mul.lo.s64 %rd13, %rd4, 3;
  add.s64 %rd13, %rd13, 16;         // 3 * vstep + 16

PIECE:
  setp.ge.u32 %p1, %r2, %r1;
  @%p1 bra DONE;
  @%p4 bra BLOCK;
  mul.wide.u32 %rd5, %r2, 24;
  add.s64 %rd5, %rd1, %rd5;
  ld.global.nc.u64 %rd6, [%rd5];    // src
  ld.global.nc.u64 %rd7, [%rd5+8];  // dst
  ld.global.nc.u64 %rd8, [%rd5+16]; // length
  bra COPY;

BLOCK:                              // item -> (part, block, piece), part-major
  div.u32 %r24, %r2, %r23;          // block item = item / pieces_per_block
  mul.lo.u32 %r25, %r24, %r23;
  sub.u32 %r25, %r2, %r25;          // piece within the block
  div.u32 %r26, %r24, %r22;         // part = block item / blocks
  mul.lo.u32 %r27, %r26, %r22;
  sub.u32 %r27, %r24, %r27;         // block
  mul.wide.u32 %rd22, %r26, 16;
  add.s64 %rd22, %rd19, %rd22;
  mul.wide.u32 %rd23, %r27, 16;
  add.s64 %rd23, %rd20, %rd23;
  ld.global.nc.u64 %rd6, [%rd22];   // the part's source base
  ld.global.nc.u64 %rd7, [%rd22+8]; // and destination base
  ld.global.nc.u64 %rd24, [%rd23];  // the block's source offset
  ld.global.nc.u64 %rd25, [%rd23+8];// and destination offset
  cvt.u64.u32 %rd26, %r25;
  shl.b64 %rd26, %rd26, 15;         // piece * kCopyPieceBytes
  add.s64 %rd6, %rd6, %rd24;
  add.s64 %rd6, %rd6, %rd26;
  add.s64 %rd7, %rd7, %rd25;
  add.s64 %rd7, %rd7, %rd26;
  sub.s64 %rd8, %rd21, %rd26;
  min.u64 %rd8, %rd8, 32768;        // the block's last piece may be shorter

COPY:
  cvta.to.global.u64 %rd6, %rd6;
  cvta.to.global.u64 %rd7, %rd7;
  or.b64 %rd9, %rd6, %rd7;
  and.b64 %rd9, %rd9, 15;
  setp.eq.u64 %p2, %rd9, 0;
  and.b64 %rd10, %rd8, 0xFFFFFFFFFFFFFFF0;
  selp.b64 %rd10, %rd10, 0, %p2;    // vbytes: vector part, 0 when misaligned
  shl.b64 %rd11, %rd2, 4;           // off = tid * 16

UNROLL:                             // four vectors per thread while they all fit
  add.s64 %rd14, %rd11, %rd13;
  setp.gt.u64 %p3, %rd14, %rd10;
  @%p3 bra VEC;
  add.s64 %rd15, %rd6, %rd11;
  add.s64 %rd16, %rd15, %rd4;
  add.s64 %rd17, %rd16, %rd4;
  add.s64 %rd18, %rd17, %rd4;
  ld.global.nc.v4.u32 {%r6, %r7, %r8, %r9}, [%rd15];
  ld.global.nc.v4.u32 {%r10, %r11, %r12, %r13}, [%rd16];
  ld.global.nc.v4.u32 {%r14, %r15, %r16, %r17}, [%rd17];
  ld.global.nc.v4.u32 {%r18, %r19, %r20, %r21}, [%rd18];
  add.s64 %rd15, %rd7, %rd11;
  add.s64 %rd16, %rd15, %rd4;
  add.s64 %rd17, %rd16, %rd4;
  add.s64 %rd18, %rd17, %rd4;
  st.global.v4.u32 [%rd15], {%r6, %r7, %r8, %r9};
  st.global.v4.u32 [%rd16], {%r10, %r11, %r12, %r13};
  st.global.v4.u32 [%rd17], {%r14, %r15, %r16, %r17};
  st.global.v4.u32 [%rd18], {%r18, %r19, %r20, %r21};
  add.s64 %rd11, %rd11, %rd12;
  bra UNROLL;

VEC:                                // the remaining whole vectors
  setp.ge.u64 %p3, %rd11, %rd10;
  @%p3 bra TAIL;
  add.s64 %rd15, %rd6, %rd11;
  ld.global.nc.v4.u32 {%r6, %r7, %r8, %r9}, [%rd15];
  add.s64 %rd16, %rd7, %rd11;
  st.global.v4.u32 [%rd16], {%r6, %r7, %r8, %r9};
  add.s64 %rd11, %rd11, %rd4;
  bra VEC;

TAIL:                               // bytes after the vectors (all of a misaligned piece)
  add.s64 %rd11, %rd10, %rd2;
BYTE:
  setp.ge.u64 %p3, %rd11, %rd8;
  @%p3 bra NEXT;
  add.s64 %rd15, %rd6, %rd11;
  ld.global.nc.u8 %h1, [%rd15];
  add.s64 %rd16, %rd7, %rd11;
  st.global.u8 [%rd16], %h1;
  add.s64 %rd11, %rd11, %rd3;
  bra BYTE;

NEXT:
  add.u32 %r2, %r2, %r3;
  bra PIECE;

DONE:
  ret;
}
)PTX";

}  // namespace ferry
