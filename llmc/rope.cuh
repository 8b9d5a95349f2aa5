// rope.cuh: rotary position embeddings (RoPE) on the GPU, in place on the Q and K heads of the fused
// QKV activation, in the Hugging Face Llama convention (llmc/cpu/rope.h states it in full): channel i
// of a head pairs with i + HD/2 and turns by the angle pos * inv_freq[i], pos = pos_offset + t (with
// doc_start, --doc-positions restart: pos_offset + t - doc_start[b, t]; or, for a decode step, each
// row's own pos[b]).
// Shapes: qkv, dqkv (B, T, (NH + 2*NKV) * HD) floatX; cos, sin (max_pos, HD/2) fp32 with
// max_pos >= pos_offset + T.
//   rope_forward     rotates the Q and K heads of qkv in place (=); V is untouched
//   rope_forward_at  the same on B rows (one new token per sequence), row b at position pos[b] read on
//                    the device (a CUDA graph replays it per token); pos[b] < 0: row b left as it is
//   rope_backward    the inverse rotation of the Q and K heads of dqkv in place (=); dV is untouched
// The tables come from cpu::rope_tables_for (angles in double, rounded once to fp32), so the GPU
// rotates by bit-identical factors to the CPU reference (a device sincos in fp32 at p ~ 4096 would be
// off by ~1e-4 rad). fp32 math; HD/2 must be a multiple of x128::size. Memory-bound: reads and writes
// the Q and K heads once. Measured: docs/perf.md, "Memory-bound kernels".
#pragma once
#include "llmc/cuda_common.cuh"
#include "llmc/utils.h"

// Thread = one pack of x128::size channels i.. of the first half of one Q or K head, with its partner
// pack i+HD/2 .. of the same head. Consecutive threads take consecutive packs of a head, then the next
// head of the row (Q heads then K heads, which are contiguous), then the next row. cos/sin: L1 hits
// (shared by every head of a row). DRAM: reads and writes B*T*(NH+NKV)*HD*sizeof(floatX) bytes each.
// INVERSE: the backward's rotation by -angle. positions: nullptr, or one position per row (T = 1),
// < 0 for a row to skip. doc_start (BT) or nullptr: positions restart at each document,
// pos_offset + t - doc_start[row] (llmc/attention_layout.cuh's contract).
template <bool INVERSE>
static __global__ void rope_rotate_packed(floatX* qkv, const float* cos, const float* sin, int BT, int T, int NH,
                                          int NKV, int HD, int pos_offset, const int* positions = nullptr,
                                          const int* doc_start = nullptr) {
    const int half = HD / 2, packs_per_head = half / x128::size, heads = NH + NKV;
    // 32-bit index arithmetic (the launcher checks the thread count fits): 64-bit divisions cost ~3x
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (unsigned)BT * heads * packs_per_head) return;
    const int j = (int)(idx % packs_per_head) * x128::size;  // first channel of this pack in the head
    const unsigned head_row = idx / packs_per_head;           // (row, head) pair
    const int h = (int)(head_row % heads), row = (int)(head_row / heads);
    const int pos = positions ? positions[row] : pos_offset + row % T - (doc_start ? doc_start[row] : 0);
    if (pos < 0) return;
    floatX* x = qkv + (int64_t)row * (NH + 2 * NKV) * HD + h * HD + j;
    const float* c = cos + (int64_t)pos * half + j;
    const float* s = sin + (int64_t)pos * half + j;
    const x128 x1 = load128cs(x), x2 = load128cs(x + half);
    x128 y1, y2;
#pragma unroll
    for (int k0 = 0; k0 < x128::size; k0 += f128::size) {
        const f128 ck = load128(c + k0), sk = load128(s + k0);
        for (int k = 0; k < f128::size; k++) {
            const float a = to_float(x1[k0 + k]), b = to_float(x2[k0 + k]);
            const float sn = INVERSE ? -sk[k] : sk[k];
            y1[k0 + k] = from_float<floatX>(a * ck[k] - b * sn);
            y2[k0 + k] = from_float<floatX>(b * ck[k] + a * sn);
        }
    }
    store128(x, y1);
    store128(x + half, y2);
}

// The checks of every RoPE call (what: its name in the errors), then the launch.
template <bool INVERSE>
inline void rope_launch(const char* what, floatX* qkv, const float* cos, const float* sin, int B, int T, int NH,
                        int NKV, int HD, int pos_offset, cudaStream_t stream, const int* positions = nullptr,
                        const int* doc_start = nullptr) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0) fail("%s: B %d, T %d, NH %d, NKV %d must be positive", what, B, T, NH, NKV);
    if (HD <= 0 || HD % (2 * x128::size) != 0)
        fail("%s: head dim %d must be a positive multiple of %d", what, HD, 2 * x128::size);
    if (pos_offset < 0) fail("%s: position offset %d must be >= 0", what, pos_offset);
    const int64_t threads = (int64_t)B * T * (NH + NKV) * (HD / 2 / x128::size);
    if (threads >= (1ll << 31)) fail("rope: %lld threads exceed the kernel's 32-bit index", (long long)threads);
    const int block = 256;
    rope_rotate_packed<INVERSE><<<(unsigned)ceil_div<int64_t>(threads, block), block, 0, stream>>>(
        qkv, cos, sin, B * T, T, NH, NKV, HD, pos_offset, positions, doc_start);
    cudaCheckLaunch();
}

// qkv (B, T, (NH + 2*NKV) * HD) in place; cos, sin (max_pos >= pos_offset + T, HD/2) from cpu::rope_tables.
// doc_start (B, T) device or nullptr: positions restart at each document (--doc-positions restart).
inline void rope_forward(floatX* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                         int pos_offset, cudaStream_t stream, const int* doc_start = nullptr) {
    rope_launch<false>("rope_forward", qkv, cos, sin, B, T, NH, NKV, HD, pos_offset, stream, nullptr, doc_start);
}

// Decode: qkv (B, (NH + 2*NKV) * HD) in place, row b at position pos[b] (device, < max_pos of the
// tables; < 0: row b untouched).
inline void rope_forward_at(floatX* qkv, const float* cos, const float* sin, const int* pos, int B, int NH, int NKV,
                            int HD, cudaStream_t stream) {
    rope_launch<false>("rope_forward_at", qkv, cos, sin, B, 1, NH, NKV, HD, 0, stream, pos);
}

// dqkv (B, T, (NH + 2*NKV) * HD) in place: d(rotated qkv) in, d(qkv) out, for the Q and K heads.
inline void rope_backward(floatX* dqkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                          int pos_offset, cudaStream_t stream, const int* doc_start = nullptr) {
    rope_launch<true>("rope_backward", dqkv, cos, sin, B, T, NH, NKV, HD, pos_offset, stream, nullptr, doc_start);
}
