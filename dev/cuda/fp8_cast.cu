// fp8_cast.cu: the scaled casts to FP8 of llmc/fp8.cuh, per tensor and rowwise, checked bit for bit
// against cpu::fp8_cast (llmc/cpu/fp8.h), with the amax, the scale update and the rowwise scale_invs
// checked bit for bit too.
//   ./fp8_cast [variant ...] [--check-only] [--reps N] [--op NAME]   (--op: one op family, see main)
// Shapes, each cast to e4m3 and to e5m2 (the op name says which):
//   X (65536, 768): a layer input at GPT-2 124M, B*T = 65536 (qkv / fc input, attproj dY);
//   H (65536, 3072): the MLP activation (fcproj's input, fc's dY);
//   every bf16 value: the 65536 bit patterns (NaNs replaced by zero) as a (1024, 64) tensor, at
//   scale 1 and at 0.3 (ties, subnormals, saturation of finite values and of +-inf, -0);
//   n = 651 * 776 + 3: the tail after the last 16-byte pack (straight casts only).
// Inputs uniform in [-3, 3) rounded to floatX; the scale is current scaling's, 448 / amax (e4m3)
// or 57344 / amax (e5m2), so the values spread over the whole FP8 range, subnormals included.
// Outputs start poisoned (0xFF bytes, a NaN in both formats that no finite input casts to);
// every byte is compared; the amax and the scale by their bits.
// Bytes: the op's minimum, input once (2 bytes/element) and each FP8 output once (1 byte); a
// variant that reads more shows it as a lower % of the copy ceiling. FLOPs: 1 per element.
//
// Variants:
//   0 shipped: fp8_cast with the amax fused (delayed scaling's cast): reads 2n, writes n
//   1 current scaling as shipped: fp8_amax pass, fp8_update_scales (history 1), fp8_cast without
//     amax: reads 4n, writes n, three launches
//   2 fp8_cast without amax (what the fused amax costs: 0 against 2)
//   3 fp8_cast_transpose with amax: (R, C) -> (C, R), the weight gradient's operands
//   4 fp8_cast_transpose with amax and the straight output from the same read (dY's cast: the
//     input gradient's dY and the weight gradient's dY^T); bytes 2n in, 2n out
// The shipped kernels of --fp8-scaling rowwise (a second shipped op; variant 0 stays the default
// per-tensor cast), their scales from cpu::fp8_row_scales of the rows (5) or of the columns (6):
//   5 fp8_cast_rowwise: one scale per row, a warp per row held in registers: reads 2n, writes n + 4R
//     (shapes with C a multiple of 8, at most 4096)
//   6 fp8_cast_transpose_colwise: (R, C) -> (C, R), one scale per input column: column-amax pass,
//     scale kernel, transposed cast: reads 4n, writes n + 4C; the bytes counted are the op's
//     minimum (2n in), so its % of copy shows the extra read
// The casts fused into their producers (llmc/fp8_fused.cuh, delayed scaling: the scale is given and
// the amax recorded), ops of their own, R = 65536 and an awkward R = 192 (3 tiles, bias_backward's
// 32-row chunks not whole tiles):
//   fp8_gelu_forward_cast C = 3072 (e4m3: fcproj's X and X^T from fc's pre-activation):
//     0 shipped fp8_cast_transpose_fused GELU_FORWARD: reads 2n, writes 2n
//     1 separate passes: gelu_forward, then fp8_cast_transpose with amax: reads 4n, writes 4n
//   fp8_gelu_backward_cast C = 3072 (fc's dY, dY^T and bias gradient from d(GELU output) and the
//   pre-activation; e5m2 and e4m3):
//     0 shipped fp8_cast_transpose_fused GELU_BACKWARD with dbias: reads 4n, writes 2n
//     1 separate passes: gelu_backward_inplace, fp8_cast_transpose, bias_backward: reads 8n, writes 4n
//   fp8_cast_dbias C = 768, 2304 (a dY of fcproj / attproj / qkv with its bias gradient; e5m2):
//     0 shipped fp8_cast_transpose_fused NONE with dbias: reads 2n, writes 2n
//     1 separate passes: fp8_cast_transpose, bias_backward: reads 4n, writes 2n
//   fp8_layernorm_forward_cast C = 768 (qkv's / fc's X and X^T from the residual add + LayerNorm; e4m3):
//     0 shipped layernorm_fp8_forward with the residual: reads 4n, writes 2n + 2n (residual)
//     1 separate passes: fused_residual_layernorm_forward, fp8_cast_transpose: reads 6n, writes 6n
//     the residual, mean and rstd bit for bit equal to the bf16 kernel's as well
//   fp8_dq_cast C = 2304 (R = 192: 576, 3 heads) (qkv's dY, dY^T and bias gradient, the dQ columns
//   (Q = C / 3) from the attention backward's fp32 sums; e5m2; HD 64):
//     0 shipped fp8_cast_transpose_fused DQ_ACCUM with dbias: reads 4RQ + 2R(C - Q), writes 2n; the
//       dqkv it reads has its dQ columns poisoned (they must not be read)
//     1 separate passes, the trainer's before: attention_backward_dq_store (reads 4RQ, writes 2RQ),
//       then the NONE cast with dbias (reads 2n, writes 2n)
//     the dQ store's bf16 is itself checked against the CPU's round(sum / 8) (exact at HD 64) first
//   Every fused op also runs (the shipped kernel's knob, then its predecessor):
//     2, 3, 4, 5  the shipped kernel at 1, 2, 4, 8 tiles a block (0: fp8_fused_rows_per_chunk's choice;
//                 at R = 65536 the bias scratch makes it 2 tiles at least)
//     6  the previous kernel (prev::previous_fused_kernel: one tile a block, the column sums by 64
//        threads over a floatX copy of the tile)
//   fp8_layernorm_forward_cast also: 2 the previous row work (layernorm_row_warp's passes over the row
//   in memory, PACKS = 0) in the same kernel.
//   Shapes: R = 65536 at GPT-2 124M's widths, R = 192 (awkward), and GPT-2 774M's at B = 16 (R = 16384,
//   C = 1280: GELU at 5120, a dY at 1280, qkv's DQ_ACCUM at 3840, the LayerNorm at 1280).
//   The bytes counted are the fused minimum (so % of copy shows what the separate passes cost).
//   References: the bf16 values the shipped unfused kernels compute (gelu_forward,
//   gelu_backward_inplace: their own labs check them against llmc/cpu/gelu.h), cast by cpu::fp8_cast
//   and transposed on the host: every byte of both copies equal; the amax equal to the max |value|
//   bit for bit; the bias gradient (+= onto random values) within bf16 tolerance of a double sum (the
//   fused kernels sum in their own fixed order). Every variant is held to the same checks (the unfused
//   passes must agree with the fused kernel).
//   Results (H200, 2026-12-04, twenty-sixth run, call 3; every check passed), ms (% of copy), shipped
//   against variant 6 (the previous kernel):
//     fp8_cast_dbias R=65536 C=768 0.0732 (68.8%) / 0.0803, C=2304 0.1926 (78.4%) / 0.2065, R=16384
//       C=1280 0.0349 (60.1%) / 0.0380 (tiles: 8 within 1% of 4 at R = 65536; at R = 16384 2 and 4 tie,
//       8 is 5% slower)
//     fp8_dq_cast R=65536 C=2304 0.2143 (82.2%) / 0.2473, R=16384 C=3840 0.0934 (78.6%) / 0.1106 (4 tiles
//       2-4% slower than 2, 8 tiles 4%)
//     fp8_gelu_backward_cast R=65536 C=3072 0.3548 (85.1%) / 0.3551, R=16384 C=5120 0.1533 / 0.1534
//     fp8_gelu_forward_cast R=65536 C=3072 0.2374 (84.8%) / 0.2405, R=16384 C=5120 0.1018 / 0.1031
//     fp8_layernorm_forward_cast, shipped against variant 2 (the row's passes in memory): R=65536 C=768
//       0.1201 (83.8%) / 0.1258, R=16384 C=1280 0.0567 (73.9%) / 0.0605
//   An earlier call (call 1) with the pipelined kernel for every prologue (GELU backward at 3 blocks an
//   SM, 80 registers, 36 bytes of spill loads): GELU backward 0.4289 / 0.3551 and 0.1872 / 0.1533, GELU
//   forward 0.2491 / 0.2408; and a variant whose last block of each column tile folded the partials into
//   dbias (arrival counters, column_partials_add's order and bits): 1-5% slower than the separate fold
//   launch at every shape, so not kept. At R = 16384, C = 5120: GELU backward with the register sums
//   one tile at a time (5-6 blocks an SM) 0.1639-0.1734 against 0.1533; GELU forward pipelined 0.1068 / 0.1018.
//   Results: not yet run on a GPU (fp8_dq_cast: expected, from the bytes, 0.70 GB fused against
//   0.91 GB at R = 65536: ~0.19 ms against ~0.25 ms at ~3.7 TB/s, the dQ store alone measured 78 us in
//   the trainer's profile; `--op fp8_dq_cast` times it alone).
// fp8_transpose (bytes, no conversion; llmc/fp8.cuh): out (C, R) = in (R, C)^T at row pitches of their own.
//   Shapes: the head's dlogits^T chunk (llmc/model_fp8.cuh, fp8_head_backward): R = 32768 tokens, C =
//   50304 vocabulary rows, both pitches 100608 (the 2 Vp-byte logits rows: input in their first
//   halves, output in their second halves, one 5.06 GB buffer); and an awkward R = 192, C = 320 (odd
//   multiples of 64: half tiles at both edges) at pitches 368 and 208 (not multiples of 128).
//   Check: the whole buffer before the run holds input bytes in [0, 254] and the poison 0xFF
//   elsewhere; after it, every byte of the buffer is compared on the GPU with the expected image
//   (output region transposed, everything else, the rest of each output row included, unchanged),
//   and the guard after the buffer must be intact. Bytes: 2RC.
//     0 shipped fp8_transpose_tiled_kernel<128>: 128 x 128 tiles, 4 16-byte loads a thread, 128-byte
//       runs read and written, blocks in groups of 32 column tiles (FP8_TR_GROUP)
//     1 the previous kernel (fp8_transpose_64x128_kernel): 64 columns x 128 rows, 2 loads a thread,
//       64-byte runs (in the 124M step: 2.16 ms for two chunks, ~3.05 TB/s, from the trainer's profile)
//     2 as 0, blocks row after row of tiles (no groups)
//     3 as 0, groups of 8 column tiles
//     4 fp8_transpose_tiled_kernel<256>: 256 rows x 128 columns (8 loads a thread, 256-byte runs
//       written), groups of 32
//     5 as 4, row after row
//   Results (H200, 2026-12-04, cb4a0a2, R=32768 C=50304 pitch 100608; every byte of the buffer as
//   expected for every variant at both shapes): 0 0.9651 ms, 85.4% of copy; 1 1.1065, 74.5%; 2 0.9525,
//   86.5%; 3 0.9546, 86.3%; 4 0.9652, 85.4%; 5 0.9622, 85.7% (one run each: 0, 2-5 within 1.3%).
// Results (H200, 2026-12-03, 2622e99): every variant bit-exact; R=65536 C=768 / 3072, % of copy:
// 0 84.6 / 94.5, 1 49.5 / 56.6, 2 85.4 / 93.0, 3 85.5 / 90.6, 4 84.0 / 90.2 (docs/perf.md).
// Variants 5 and 6: not yet run on a GPU (dev/bench/fp8_rowwise.sh runs them).
#include <algorithm>
#include <cstddef>
#include <iterator>
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/fp8.h"
#include "llmc/fp8.cuh"
#include "llmc/fp8_fused.cuh"
#include "dev/cuda/fp8_lab.cuh"  // the previous kernels and the knobs the shipped launchers fix
#include "llmc/matmul.cuh"  // bias_backward, the separate pass the fused casts replace
// the dQ store DQ_ACCUM replaces (attention_detail::dq_store; this header alone, not attention.cuh,
// whose Hopper kernels would all compile into this lab)
#include "llmc/attention_mma_backward.cuh"

// The fused casts' previous kernel (variant 7 of the fused ops; shipped until 2026-12-04): one 64 x 64
// tile at a time per block, no loads in flight across the shared-memory passes, the bias's column sums
// by threads 0..63 over a floatX copy of the tile (64 dependent adds a tile while the other 6 warps
// wait), chunks of bias_backward's rows rounded up to whole tiles, partials folded by
// column_partials_add.
namespace prev {
constexpr int PREV_BPITCH = FP8_T_TILE + 8;  // floatX tile pitch: 16-byte rows, no bank conflicts on the pack stores
template <Fp8Format F, Fp8Prologue PRO, bool COLSUM, int DQ_HD = 0>
static __global__ void __launch_bounds__(FP8_T_BLOCK)
    previous_fused_kernel(uint8_t* __restrict__ out_t, uint8_t* __restrict__ out, const floatX* __restrict__ in,
                                    const floatX* __restrict__ pre, const float* __restrict__ dq_accum, int q_cols,
                                    float* __restrict__ partials, int R, int C, int rows_per_chunk, Fp8Meta* meta) {
    static_assert((PRO == Fp8Prologue::DQ_ACCUM) == (DQ_HD == 64 || DQ_HD == 128), "DQ_HD: DQ_ACCUM's head size");
    constexpr int P = x128::size, PACKS_PER_ROW = FP8_T_TILE / P;
    constexpr int LOADS = FP8_T_TILE * PACKS_PER_ROW / FP8_T_BLOCK;
    constexpr int DQ_LOADS = PRO == Fp8Prologue::DQ_ACCUM ? LOADS : 1, DQ_PARTS = P / f128::size;
    __shared__ alignas(16) uint8_t tile[FP8_T_TILE][FP8_T_PITCH];
    __shared__ alignas(16) floatX vals[COLSUM ? FP8_T_TILE : 1][COLSUM ? PREV_BPITCH : 8];
    const int c0 = blockIdx.x * FP8_T_TILE, chunk = blockIdx.y;
    const int r_begin = chunk * rows_per_chunk, r_end = min(R, r_begin + rows_per_chunk);
    const bool from_dq = PRO == Fp8Prologue::DQ_ACCUM && c0 < q_cols;  // block-uniform: whole tiles
    const float scale = meta->scale;
    unsigned int amax = 0;
    float colsum = 0.0f;  // COLSUM: column c0 + threadIdx.x (threads < 64), rows of this chunk in order
    for (int r0 = r_begin; r0 < r_end; r0 += FP8_T_TILE) {
        x128 v[LOADS], g[LOADS];
        f128 d[DQ_LOADS][DQ_PARTS];  // DQ_ACCUM: a pack's P fp32 sums
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const int idx = threadIdx.x + j * FP8_T_BLOCK, r = idx / PACKS_PER_ROW, p = idx % PACKS_PER_ROW;
            const int64_t at = (int64_t)(r0 + r) * C + c0 + p * P;
            if constexpr (PRO == Fp8Prologue::DQ_ACCUM) {
                if (from_dq) {
                    const float* src = dq_accum + (int64_t)(r0 + r) * q_cols + c0 + p * P;
#pragma unroll
                    for (int q = 0; q < DQ_PARTS; q++) d[j][q] = load128cs(src + q * f128::size);
                } else {
                    v[j] = load128cs(in + at);
                }
            } else {
                v[j] = load128cs(in + at);
            }
            if (PRO == Fp8Prologue::GELU_BACKWARD) g[j] = load128cs(pre + at);
        }
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const int idx = threadIdx.x + j * FP8_T_BLOCK, r = idx / PACKS_PER_ROW, p = idx % PACKS_PER_ROW;
            // x rounded to floatX: the values the unfused kernel would have written
#pragma unroll
            for (int k = 0; k < P; k++) {
                if (PRO == Fp8Prologue::GELU_FORWARD) v[j][k] = from_float<floatX>(gelu_tanh(to_float(v[j][k])));
                if (PRO == Fp8Prologue::GELU_BACKWARD)
                    v[j][k] = from_float<floatX>(to_float(v[j][k]) * gelu_tanh_grad(to_float(g[j][k])));
            }
            if constexpr (PRO == Fp8Prologue::DQ_ACCUM) {
                if (from_dq)  // the dQ store's bf16 (floatX is bf16 wherever the backward leaves dQ)
#pragma unroll
                    for (int k = 0; k < P; k++)
                        v[j][k] = from_float<floatX>(
                            to_float(attention_detail::dq_from_accum<DQ_HD>(d[j][k / f128::size][k % f128::size])));
            }
            Fp8Pack o;
#pragma unroll
            for (int k = 0; k < P; k += 2) {
                const float a = to_float(v[j][k]), b = to_float(v[j][k + 1]);
                amax = max(amax, max(abs_bits(a), abs_bits(b)));
                o.h[k / 2] = fp8x2_from_float2<F>(a * scale, b * scale);
                *reinterpret_cast<uint16_t*>(&tile[r][p * P + k]) = o.h[k / 2];
            }
            *reinterpret_cast<Fp8Pack*>(out + (int64_t)(r0 + r) * C + c0 + p * P) = o;
            if (COLSUM) store128(&vals[r][p * P], v[j]);
        }
        __syncthreads();
        fp8_tile_store_transposed(out_t, tile, R, r0, c0);
        if (COLSUM && threadIdx.x < FP8_T_TILE)
#pragma unroll 16
            for (int r = 0; r < FP8_T_TILE; r++) colsum += to_float(vals[r][threadIdx.x]);
        __syncthreads();  // the next tile overwrites the shared tiles
    }
    if (COLSUM && threadIdx.x < FP8_T_TILE) partials[(int64_t)chunk * C + c0 + threadIdx.x] = colsum;
    amax_block_commit(meta, amax);
}

inline void previous_fused_cast(uint8_t* out_t, uint8_t* out, const floatX* in, const floatX* pre, int R, int C,
                                Fp8Format f, Fp8Meta* meta, Fp8Prologue prologue, floatX* dbias, float* scratch,
                                cudaStream_t stream, const Fp8DqAccum& dq = {}) {
    const int rpc = ceil_div(ceil_div(R, column_num_chunks(R)), FP8_T_TILE) * FP8_T_TILE, chunks = ceil_div(R, rpc);
    const dim3 grid(C / FP8_T_TILE, chunks);
    auto launch = [&](auto kernel) {
        kernel<<<grid, FP8_T_BLOCK, 0, stream>>>(out_t, out, in, pre, dq.accum, dq.q_cols, scratch, R, C, rpc, meta);
        cudaCheckLaunch();
    };
    constexpr Fp8Format E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
    const bool e4 = f == E4, bias = dbias != nullptr;
    switch (prologue) {
        case Fp8Prologue::NONE:
            if (bias) e4 ? launch(previous_fused_kernel<E4, Fp8Prologue::NONE, true>) : launch(previous_fused_kernel<E5, Fp8Prologue::NONE, true>);
            else e4 ? launch(previous_fused_kernel<E4, Fp8Prologue::NONE, false>) : launch(previous_fused_kernel<E5, Fp8Prologue::NONE, false>);
            break;
        case Fp8Prologue::GELU_FORWARD:
            e4 ? launch(previous_fused_kernel<E4, Fp8Prologue::GELU_FORWARD, false>) : launch(previous_fused_kernel<E5, Fp8Prologue::GELU_FORWARD, false>);
            break;
        case Fp8Prologue::GELU_BACKWARD:
            if (bias) e4 ? launch(previous_fused_kernel<E4, Fp8Prologue::GELU_BACKWARD, true>) : launch(previous_fused_kernel<E5, Fp8Prologue::GELU_BACKWARD, true>);
            else e4 ? launch(previous_fused_kernel<E4, Fp8Prologue::GELU_BACKWARD, false>) : launch(previous_fused_kernel<E5, Fp8Prologue::GELU_BACKWARD, false>);
            break;
        case Fp8Prologue::DQ_ACCUM:  // the lab's HD 64, with the bias
            e4 ? launch(previous_fused_kernel<E4, Fp8Prologue::DQ_ACCUM, true, 64>) : launch(previous_fused_kernel<E5, Fp8Prologue::DQ_ACCUM, true, 64>);
            break;
    }
    if (bias) column_partials_add(dbias, scratch, chunks, C, C, stream);
}
}  // namespace prev

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static std::vector<uint8_t> download_bytes(const lab::DevBuf<uint8_t>& b) {
    std::vector<uint8_t> h(b.size());
    cudaCheck(cudaMemcpy(h.data(), b.get(), b.size(), cudaMemcpyDeviceToHost));
    return h;
}
static Fp8Meta download_meta(const lab::DevBuf<Fp8Meta>& m) {
    Fp8Meta h;
    cudaCheck(cudaMemcpy(&h, m.get(), sizeof(h), cudaMemcpyDeviceToHost));
    return h;
}

// Every byte equal, every byte written, the guard intact; one line.
static bool check_bytes(const lab::DevBuf<uint8_t>& out, const std::vector<uint8_t>& ref, const std::vector<float>& x,
                        bool transposed, int R, int C) {
    cudaCheck(cudaDeviceSynchronize());
    bool ok = true;
    if (size_t unwritten = out.count_unwritten()) {
        printf("    %-10s FAIL: %zu of %zu bytes never written\n", out.name(), unwritten, out.size());
        ok = false;
    }
    if (!out.guard_intact()) {
        printf("    %-10s FAIL: the kernel wrote into the guard region after the output\n", out.name());
        ok = false;
    }
    const std::vector<uint8_t> got = download_bytes(out);
    size_t bad = 0, first = SIZE_MAX;
    for (size_t i = 0; i < ref.size(); i++)
        if (got[i] != ref[i]) {
            if (first == SIZE_MAX) first = i;
            bad++;
        }
    if (bad == 0) {
        printf("    %-10s %zu bytes bit-exact  ok\n", out.name(), ref.size());
    } else {
        // the input element of the first mismatch (transposed outputs: element (r, c) sits at c * R + r)
        const size_t src = transposed ? (first % R) * (size_t)C + first / R : first;
        printf("    %-10s FAIL: %zu of %zu bytes differ; first at %zu: got 0x%02X want 0x%02X (input %.9g)\n", out.name(),
               bad, ref.size(), first, got[first], ref[first], x[src]);
        ok = false;
    }
    return ok;
}
// Every scale_inv equal to 1 / the CPU's scale, bit for bit, every one written.
static bool check_scale_invs(const lab::DevBuf<float>& d, const std::vector<float>& scale) {
    bool ok = d.count_unwritten() == 0 && d.guard_intact();
    if (!ok) printf("    %-10s FAIL: not every scale_inv written, or the guard changed\n", d.name());
    const std::vector<float> got = d.download();
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < scale.size(); i++)
        if (float_bits(got[i]) != float_bits(1.0f / scale[i]) && bad++ == 0) first = i;
    if (bad) printf("    %-10s FAIL: %zu of %zu differ; first [%zu] got %.9g want %.9g\n", d.name(), bad, scale.size(),
                    first, got[first], 1.0f / scale[first]);
    else printf("    %-10s %zu scale_invs bit-exact  ok\n", d.name(), scale.size());
    return ok && bad == 0;
}
static bool check_amax(const lab::DevBuf<Fp8Meta>& meta, float amax_ref) {
    const Fp8Meta m = download_meta(meta);
    const bool ok = m.amax_bits == float_bits(amax_ref);
    printf("    %-10s 0x%08X want 0x%08X (%g)  %s\n", "amax", m.amax_bits, float_bits(amax_ref), amax_ref,
           ok ? "ok" : "FAIL");
    return ok;
}

// The fused cast's bias gradient against bias_backward's, bit for bit (where its row chunks are
// whole tiles): prints one line, true when every column's bits agree.
// The CPU's cast of x (R, C) at `scale`: the straight bytes, the transposed ones (C, R) where asked,
// and the Fp8Meta as fp8_meta_init leaves it with that scale (the casts read it as given).
struct CastRef {
    std::vector<uint8_t> out, out_t;
    std::vector<Fp8Meta> meta0;  // (1), for DevBuf::upload
};
static CastRef cast_reference(const std::vector<float>& x, int R, int C, bool transposed, Fp8Format f, float scale) {
    const cpu::Fp8Format cf = fp8_cpu_format(f);
    const size_t n = (size_t)R * C;
    CastRef ref;
    ref.out.resize(n);
    ref.out_t.resize(transposed ? n : 0);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) ref.out[i] = cpu::fp8_cast(x[i], scale, cf);
    if (transposed) {
#pragma omp parallel for
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++) ref.out_t[(size_t)c * R + r] = ref.out[(size_t)r * C + c];
    }
    ref.meta0.resize(1);
    memset(ref.meta0.data(), 0, sizeof(Fp8Meta));
    ref.meta0[0].scale = scale;
    ref.meta0[0].scale_inv = 1.0f / scale;
    ref.meta0[0].fp8_max = fp8_format_max(f);
    return ref;
}
// Both copies of a transposing cast that also writes the straight output, and its amax.
static bool check_both_copies(const CastRef& ref, const lab::DevBuf<uint8_t>& out_t, const lab::DevBuf<uint8_t>& out,
                              const lab::DevBuf<Fp8Meta>& meta, float amax_ref, const std::vector<float>& x, int R,
                              int C) {
    bool ok = check_bytes(out_t, ref.out_t, x, true, R, C);
    ok = check_bytes(out, ref.out, x, false, R, C) && ok;
    return check_amax(meta, amax_ref) && ok;
}

struct Shape {
    std::string name;
    int R, C;           // (R, C) row-major; R = 1 for the 1-D tail shape
    bool transposable;  // R and C multiples of 64
};

// The 65536 bf16 bit patterns as floats, NaNs replaced by 0.
static std::vector<float> every_bf16() {
    std::vector<float> v(65536);
    for (uint32_t b = 0; b < 65536; b++) {
        const uint32_t u = b << 16;
        float x;
        memcpy(&x, &u, 4);
        v[b] = std::isnan(x) ? 0.0f : x;
    }
    return v;
}

// fixed_scale > 0: that scale (set directly), else current scaling's from the amax.
static void run_shape(lab::Lab& L, const Shape& s, Fp8Format f, const std::vector<float>& x, float fixed_scale) {
    const size_t n = (size_t)s.R * s.C;
    const cpu::Fp8Format cf = fp8_cpu_format(f);
    float amax_ref = 0.0f;
    for (float v : x) amax_ref = std::max(amax_ref, std::fabs(v));  // never NaN here; +inf in every_bf16
    const float scale = fixed_scale > 0 ? fixed_scale : cpu::fp8_scale_from_amax(amax_ref, cf, 0, 1.0f);
    const CastRef cref = cast_reference(x, s.R, s.C, s.transposable, f, scale);

    lab::DevBuf<floatX> d_x(n, "x");
    lab::DevBuf<uint8_t> d_out(n, "out"), d_out_t(s.transposable ? n : 1, "out_t");
    lab::DevBuf<Fp8Meta> d_meta(1, "meta");
    d_x.upload(x);
    const size_t amax_offset = offsetof(Fp8Meta, amax_bits);
    auto reset_meta = [&] { d_meta.upload(cref.meta0); };
    auto zero_amax = [&] { cudaCheck(cudaMemsetAsync((char*)d_meta.get() + amax_offset, 0, 4, L.stream())); };

    const std::string op = lab::Lab::strprintf("fp8_cast %s %s", fp8_format_name(f), s.name.c_str());
    const double flops = (double)n, bytes = (double)n * (sizeof(floatX) + 1);  // in once, one FP8 byte out
    L.run(op, 0, "shipped cast+amax", bytes, flops, lab::Bound::Memory,
          [&] { reset_meta(); d_out.poison(L.stream()); },
          [&] { fp8_cast(d_out, d_x, n, f, d_meta, true, L.ctx); },
          [&] { return check_bytes(d_out, cref.out, x, false, s.R, s.C) && check_amax(d_meta, amax_ref); });
    if (fixed_scale <= 0) {
        // current scaling end to end: the scale comes out of the amax pass and the update kernel,
        // and must equal cpu::fp8_scale_from_amax bit for bit (else the bytes differ too)
        L.run(op, 1, "amax pass+update+cast", bytes, flops, lab::Bound::Memory,
              [&] {
                  reset_meta();
                  d_out.poison(L.stream());
                  // a wrong scale to start from: the update must replace it
                  cudaCheck(cudaMemsetAsync(d_meta.get(), 0, 8, L.stream()));
              },
              [&] {
                  zero_amax();
                  fp8_amax(d_x, n, d_meta, L.ctx);
                  fp8_update_scales(d_meta, 1, 1, 0, L.stream());
                  fp8_cast(d_out, d_x, n, f, d_meta, false, L.ctx);
              },
              [&] {
                  const Fp8Meta m = download_meta(d_meta);
                  const bool ok = float_bits(m.scale) == float_bits(scale) &&
                                  float_bits(m.scale_inv) == float_bits(1.0f / scale) && m.amax_bits == 0 &&
                                  float_bits(m.amax_history[0]) == float_bits(amax_ref);
                  printf("    %-10s scale %.9g (want %.9g), scale_inv %.9g (want %.9g), history[0] %g  %s\n", "meta",
                         m.scale, scale, m.scale_inv, 1.0f / scale, m.amax_history[0], ok ? "ok" : "FAIL");
                  return check_bytes(d_out, cref.out, x, false, s.R, s.C) && ok;
              });
    }
    L.run(op, 2, "cast, no amax", bytes, flops, lab::Bound::Memory,
          [&] { reset_meta(); d_out.poison(L.stream()); },
          [&] { fp8_cast(d_out, d_x, n, f, d_meta, false, L.ctx); },
          [&] { return check_bytes(d_out, cref.out, x, false, s.R, s.C); });
    if (s.C % x128::size == 0 && s.C <= FP8_ROWWISE_MAX_C) {
        // rowwise: scale[r] from row r's amax
        std::vector<float> row_scale(s.R);
        cpu::fp8_row_scales(row_scale.data(), x.data(), s.R, s.C, cf);
        std::vector<uint8_t> ref_rows(n);
#pragma omp parallel for
        for (size_t i = 0; i < n; i++) ref_rows[i] = cpu::fp8_cast(x[i], row_scale[i / s.C], cf);
        lab::DevBuf<float> d_sinv(s.R, "row_sinv");
        L.run(op, 5, "shipped rowwise cast", bytes + 4.0 * s.R, flops, lab::Bound::Memory,
              [&] { d_out.poison(L.stream()); d_sinv.poison(L.stream()); },
              [&] { fp8_cast_rowwise(d_out, d_sinv, d_x, s.R, s.C, f, L.stream()); },
              [&] { return check_bytes(d_out, ref_rows, x, false, s.R, s.C) && check_scale_invs(d_sinv, row_scale); });
    }
    if (!s.transposable) return;
    {
        // colwise: row c of the transposed output scaled from column c's amax
        std::vector<float> xt(n), col_scale(s.C);
        for (int r = 0; r < s.R; r++)
            for (int c = 0; c < s.C; c++) xt[(size_t)c * s.R + r] = x[(size_t)r * s.C + c];
        cpu::fp8_row_scales(col_scale.data(), xt.data(), s.C, s.R, cf);
        std::vector<uint8_t> ref_cols(n);
#pragma omp parallel for
        for (size_t i = 0; i < n; i++) ref_cols[i] = cpu::fp8_cast(xt[i], col_scale[i / s.R], cf);
        lab::DevBuf<float> d_sinv(s.C, "col_sinv"), d_scratch(2 * (size_t)s.C, "scratch");
        L.run(op, 6, "shipped colwise transposed cast", bytes + 4.0 * s.C, flops, lab::Bound::Memory,
              [&] { d_out_t.poison(L.stream()); d_sinv.poison(L.stream()); },
              [&] { fp8_cast_transpose_colwise(d_out_t, d_sinv, d_x, s.R, s.C, f, d_scratch, L.stream()); },
              [&] { return check_bytes(d_out_t, ref_cols, xt, false, s.C, s.R) && check_scale_invs(d_sinv, col_scale); });
    }
    L.run(op, 3, "transposed cast+amax", bytes, flops, lab::Bound::Memory,
          [&] { reset_meta(); d_out_t.poison(L.stream()); },
          [&] { fp8_cast_transpose(d_out_t, nullptr, d_x, s.R, s.C, f, d_meta, true, L.stream()); },
          [&] { return check_bytes(d_out_t, cref.out_t, x, true, s.R, s.C) && check_amax(d_meta, amax_ref); });
    L.run(op, 4, "transposed+straight+amax", (double)n * (sizeof(floatX) + 2), flops, lab::Bound::Memory,
          [&] { reset_meta(); d_out.poison(L.stream()); d_out_t.poison(L.stream()); },
          [&] { fp8_cast_transpose(d_out_t, d_out, d_x, s.R, s.C, f, d_meta, true, L.stream()); },
          [&] { return check_both_copies(cref, d_out_t, d_out, d_meta, amax_ref, x, s.R, s.C); });
}

// The fused casts of llmc/fp8_fused.cuh at (R, C) in format f: see the top.
// The shipped fused cast's tiles per block and the previous kernel, variants 2-6 of every fused op (see
// the top): call(tiles) runs fp8_lab::fused_cast_tiles, prev() the previous kernel.
static void fused_variants(lab::Lab& L, const std::string& op, double bytes, double flops,
                           const std::function<void()>& reset, const std::function<bool()>& check,
                           const std::function<void(int)>& call, const std::function<void()>& prev) {
    L.run(op, 2, "1 tile a block", bytes, flops, lab::Bound::Memory, reset, [&] { call(1); }, check);
    L.run(op, 3, "2 tiles a block", bytes, flops, lab::Bound::Memory, reset, [&] { call(2); }, check);
    L.run(op, 4, "4 tiles a block", bytes, flops, lab::Bound::Memory, reset, [&] { call(4); }, check);
    L.run(op, 5, "8 tiles a block", bytes, flops, lab::Bound::Memory, reset, [&] { call(8); }, check);
    L.run(op, 6, "previous kernel", bytes, flops, lab::Bound::Memory, reset, prev, check);
}

static void run_fused(lab::Lab& L, const char* opname, Fp8Prologue pro, int R, int C, Fp8Format f, uint64_t seed) {
    const size_t n = (size_t)R * C;
    const cpu::Fp8Format cf = fp8_cpu_format(f);
    const bool gelu_bwd = pro == Fp8Prologue::GELU_BACKWARD, with_bias = pro != Fp8Prologue::GELU_FORWARD;
    // inputs: the pre-activation (GELU forward), d(GELU output) and the pre-activation (backward), a dY
    const std::vector<float> in = lab::rand_uniform(n, seed, pro == Fp8Prologue::GELU_FORWARD ? -4.0f : -1.0f, pro == Fp8Prologue::GELU_FORWARD ? 4.0f : 1.0f);
    const std::vector<float> pre = gelu_bwd ? lab::rand_uniform(n, seed + 1, -4.0f, 4.0f) : std::vector<float>();
    const std::vector<float> db0 = with_bias ? lab::rand_uniform(C, seed + 2, -0.5f, 0.5f) : std::vector<float>();
    lab::DevBuf<floatX> d_in(n, "in"), d_pre(gelu_bwd ? n : 1, "pre"), d_x(n, "x (bf16)");
    lab::DevBuf<floatX> d_db(with_bias ? C : 1, "dbias");
    lab::DevBuf<float> d_scratch((size_t)column_num_chunks(R) * C, "scratch");
    lab::DevBuf<uint8_t> d_out(n, "out"), d_out_t(n, "out_t");
    lab::DevBuf<Fp8Meta> d_meta(1, "meta");
    d_in.upload(in);
    if (gelu_bwd) d_pre.upload(pre);
    // x, the tensor before the cast, as the shipped unfused kernels compute it on the GPU
    cudaCheck(cudaMemcpy(d_x.get(), d_in.get(), n * sizeof(floatX), cudaMemcpyDeviceToDevice));
    if (pro == Fp8Prologue::GELU_FORWARD) gelu_forward(d_x, d_in, (int64_t)n, 0);
    if (gelu_bwd) gelu_backward_inplace(d_x, d_pre, (int64_t)n, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> x = d_x.download();
    float amax_ref = 0.0f;
    for (float v : x) amax_ref = std::max(amax_ref, std::fabs(v));
    // delayed scaling: a scale from an earlier amax, here 90% of this one's (some values saturate)
    const float scale = cpu::fp8_scale_from_amax(0.9f * amax_ref, cf, 0, 1.0f);
    const CastRef cref = cast_reference(x, R, C, true, f, scale);
    std::vector<float> db_ref(with_bias ? C : 0);
    for (int c = 0; c < (int)db_ref.size(); c++) {
        double sum = 0.0;
        for (int r = 0; r < R; r++) sum += x[(size_t)r * C + c];
        db_ref[c] = (float)(db0[c] + sum);
    }

    auto reset = [&] {
        d_meta.upload(cref.meta0);
        d_out.poison(L.stream());
        d_out_t.poison(L.stream());
        if (with_bias) d_db.upload(db0);
    };
    auto check = [&] {
        bool ok = check_both_copies(cref, d_out_t, d_out, d_meta, amax_ref, x, R, C);
        if (with_bias) ok = L.check(d_db, db_ref) && ok;
        return ok;
    };
    const std::string op = lab::Lab::strprintf("%s %s R=%d C=%d", opname, fp8_format_name(f), R, C);
    const double bytes = (double)n * ((gelu_bwd ? 2 : 1) * sizeof(floatX) + 2), flops = (double)n;
    L.run(op, 0, "shipped fused", bytes, flops, lab::Bound::Memory, reset,
          [&] {
              fp8_cast_transpose_fused(d_out_t, d_out, d_in, gelu_bwd ? d_pre.get() : nullptr, R, C, f, d_meta, pro,
                                       with_bias ? d_db.get() : nullptr, d_scratch, L.stream());
          },
          check);
    // separate passes; gelu_backward_inplace works in place, so on d_x, which holds its own result
    // already: the restore copy back from d_in is part of the reset, not the timing
    L.run(op, 1, "separate passes", bytes, flops, lab::Bound::Memory,
          [&] {
              reset();
              if (gelu_bwd) cudaCheck(cudaMemcpyAsync(d_x.get(), d_in.get(), n * sizeof(floatX), cudaMemcpyDeviceToDevice, L.stream()));
          },
          [&] {
              const floatX* src = d_in;
              if (pro == Fp8Prologue::GELU_FORWARD) { gelu_forward(d_x, d_in, (int64_t)n, L.stream()); src = d_x; }
              if (gelu_bwd) { gelu_backward_inplace(d_x, d_pre, (int64_t)n, L.stream()); src = d_x; }
              fp8_cast_transpose(d_out_t, d_out, src, R, C, f, d_meta, true, L.stream());
              if (with_bias) bias_backward(d_db, d_scratch, src, R, C, L.stream());
          },
          check);
    const floatX* pre_or_null = gelu_bwd ? d_pre.get() : nullptr;
    floatX* db_or_null = with_bias ? d_db.get() : nullptr;
    fused_variants(L, op, bytes, flops, reset, check,
                   [&](int tiles) {
                       fp8_lab::fused_cast_tiles(d_out_t, d_out, d_in, pre_or_null, R, C, f, d_meta, pro, db_or_null,
                                                 d_scratch, L.stream(), {}, tiles);
                   },
                   [&] { prev::previous_fused_cast(d_out_t, d_out, d_in, pre_or_null, R, C, f, d_meta, pro, db_or_null, d_scratch, L.stream()); });
}

#if !defined(PRECISION_FP32)  // the attention backward's dQ is bf16: a bf16 build's op
// qkv's dY with the dQ columns from the attention backward's fp32 sums (DQ_ACCUM, see the top): NH
// heads of 64 at R rows, dqkv (R, 3 NH 64).
static void run_dq_cast(lab::Lab& L, int R, int NH, Fp8Format f, uint64_t seed) {
    constexpr int HD = 64;  // GPT-2's: the scale 1/8 is exact, so the CPU forms dQ bit for bit
    const int Q = NH * HD, C = 3 * Q;
    const size_t n = (size_t)R * C;
    const cpu::Fp8Format cf = fp8_cpu_format(f);
    // the sums as the backward leaves them (fp32 atomics' results: any floats), dK and dV in bf16, a
    // bias gradient to add onto
    const std::vector<float> sums = lab::rand_uniform((size_t)R * Q, seed, -8.0f, 8.0f);
    const std::vector<float> in = lab::rand_uniform(n, seed + 1, -1.0f, 1.0f);
    const std::vector<float> db0 = lab::rand_uniform(C, seed + 2, -0.5f, 0.5f);
    lab::DevBuf<float> d_sums((size_t)R * Q, "dq sums"), d_scratch((size_t)column_num_chunks(R) * C, "scratch");
    lab::DevBuf<floatX> d_in(n, "dqkv (dQ poisoned)"), d_x(n, "dqkv (stored)");
    lab::DevBuf<floatX> d_db(C, "dbias");
    lab::DevBuf<uint8_t> d_out(n, "out"), d_out_t(n, "out_t");
    lab::DevBuf<Fp8Meta> d_meta(1, "meta");
    d_sums.upload(sums);
    d_in.upload(in);
    // the dQ columns of a dqkv the backward left them in: poisoned (never read by DQ_ACCUM)
    auto poison_dq = [&](floatX* p, cudaStream_t st) {
        cudaCheck(cudaMemset2DAsync(p, C * sizeof(floatX), lab::POISON_BYTE, Q * sizeof(floatX), R, st));
    };
    poison_dq(d_in, 0);
    // x: the values the cast sees, from the shipped dQ store on the GPU, checked against the CPU's
    // round(sum / 8) bit for bit
    cudaCheck(cudaMemcpy(d_x.get(), d_in.get(), n * sizeof(floatX), cudaMemcpyDeviceToDevice));
    attention_detail::dq_store(d_x, d_sums, 1, R, attention_detail::QKVLayout{NH, NH, HD}, 0);
    Fp8DqAccum dq;
    dq.accum = d_sums, dq.q_cols = Q, dq.head_dim = HD;
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> x = d_x.download();
    size_t store_bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            const float want = to_float(from_float<floatX>(c < Q ? sums[(size_t)r * Q + c] * 0.125f : in[i]));
            store_bad += float_bits(x[i]) != float_bits(want);
        }
    printf("%s: the dQ store's values against the CPU's round(sum / 8): %zu of %zu differ  %s\n",
           lab::Lab::strprintf("fp8_dq_cast R=%d C=%d", R, C).c_str(), store_bad, n, store_bad ? "FAIL" : "ok");
    float amax_ref = 0.0f;
    for (float v : x) amax_ref = std::max(amax_ref, std::fabs(v));
    const float scale = cpu::fp8_scale_from_amax(0.9f * amax_ref, cf, 0, 1.0f);  // delayed: an earlier amax
    const CastRef cref = cast_reference(x, R, C, true, f, scale);
    std::vector<float> db_ref(C);
    for (int c = 0; c < C; c++) {
        double sum = 0.0;
        for (int r = 0; r < R; r++) sum += x[(size_t)r * C + c];
        db_ref[c] = (float)(db0[c] + sum);
    }
    auto reset = [&] {
        d_meta.upload(cref.meta0);
        d_out.poison(L.stream());
        d_out_t.poison(L.stream());
        d_db.upload(db0);
        poison_dq(d_x, L.stream());  // the separate passes' dQ store must write them again
    };
    auto check = [&] {
        bool ok = store_bad == 0 && check_both_copies(cref, d_out_t, d_out, d_meta, amax_ref, x, R, C);
        return L.check(d_db, db_ref) && ok;
    };
    const std::string op = lab::Lab::strprintf("fp8_dq_cast %s R=%d C=%d", fp8_format_name(f), R, C);
    // the fused minimum: the sums (4 bytes) for the dQ columns, bf16 for the rest, two FP8 copies out
    const double bytes = (double)R * Q * 4 + (double)R * (C - Q) * sizeof(floatX) + 2.0 * n, flops = (double)n;
    L.run(op, 0, "shipped fused", bytes, flops, lab::Bound::Memory, reset,
          [&] {
              fp8_cast_transpose_fused(d_out_t, d_out, d_in, nullptr, R, C, f, d_meta, Fp8Prologue::DQ_ACCUM, d_db,
                                       d_scratch, L.stream(), dq);
          },
          check);
    L.run(op, 1, "dQ store + NONE cast", bytes, flops, lab::Bound::Memory, reset,
          [&] {
              attention_detail::dq_store(d_x, d_sums, 1, R, attention_detail::QKVLayout{NH, NH, HD}, L.stream());
              fp8_cast_transpose_fused(d_out_t, d_out, d_x, nullptr, R, C, f, d_meta, Fp8Prologue::NONE, d_db, d_scratch,
                                       L.stream());
          },
          check);
    fused_variants(L, op, bytes, flops, reset, check,
                   [&](int tiles) {
                       fp8_lab::fused_cast_tiles(d_out_t, d_out, d_in, nullptr, R, C, f, d_meta, Fp8Prologue::DQ_ACCUM,
                                                 d_db, d_scratch, L.stream(), dq, tiles);
                   },
                   [&] { prev::previous_fused_cast(d_out_t, d_out, d_in, nullptr, R, C, f, d_meta, Fp8Prologue::DQ_ACCUM, d_db, d_scratch, L.stream(), dq); });
}
#endif

// layernorm_fp8_forward against fused_residual_layernorm_forward + the CPU cast (see the top).
static void run_layernorm_fp8(lab::Lab& L, int R, int C, uint64_t seed) {
    const size_t n = (size_t)R * C;
    const cpu::Fp8Format cf = cpu::Fp8Format::E4M3;
    const std::vector<float> in1 = lab::rand_uniform(n, seed, -2.0f, 2.0f), in2 = lab::rand_uniform(n, seed + 1, -1.0f, 1.0f);
    const std::vector<float> w = lab::rand_uniform(C, seed + 2, 0.5f, 1.5f), b = lab::rand_uniform(C, seed + 3, -0.5f, 0.5f);
    lab::DevBuf<floatX> d_in1(n, "inp1"), d_in2(n, "inp2"), d_w(C, "weight"), d_b(C, "bias");
    lab::DevBuf<floatX> d_res(n, "residual"), d_res_ref(n, "residual ref"), d_ln(n, "ln (bf16)");
    lab::DevBuf<float> d_mean(R, "mean"), d_rstd(R, "rstd"), d_mean_ref(R, "mean ref"), d_rstd_ref(R, "rstd ref");
    lab::DevBuf<uint8_t> d_out(n, "out"), d_out_t(n, "out_t");
    lab::DevBuf<Fp8Meta> d_meta(1, "meta");
    d_in1.upload(in1);
    d_in2.upload(in2);
    d_w.upload(w);
    d_b.upload(b);
    fused_residual_layernorm_forward(d_res_ref, d_ln, d_mean_ref, d_rstd_ref, d_in1, d_in2, d_w, d_b, R, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> x = d_ln.download(), res_ref = d_res_ref.download();
    const std::vector<float> mean_ref = d_mean_ref.download(), rstd_ref = d_rstd_ref.download();
    float amax_ref = 0.0f;
    for (float v : x) amax_ref = std::max(amax_ref, std::fabs(v));
    const float scale = cpu::fp8_scale_from_amax(0.9f * amax_ref, cf, 0, 1.0f);  // delayed: an earlier amax
    const CastRef cref = cast_reference(x, R, C, true, Fp8Format::E4M3, scale);
    auto reset = [&] {
        d_meta.upload(cref.meta0);
        for (auto* o : {&d_out, &d_out_t}) o->poison(L.stream());
        d_res.poison(L.stream());
        d_mean.poison(L.stream());
        d_rstd.poison(L.stream());
    };
    auto same_bits = [](const char* what, const std::vector<float>& got, const std::vector<float>& want) {
        size_t bad = 0;
        for (size_t i = 0; i < want.size(); i++) bad += float_bits(got[i]) != float_bits(want[i]);
        printf("    %-10s %s: %zu of %zu differ from the bf16 kernel's\n", what, bad ? "FAIL" : "ok", bad, want.size());
        return bad == 0;
    };
    auto check = [&] {
        bool ok = check_both_copies(cref, d_out_t, d_out, d_meta, amax_ref, x, R, C);
        ok = d_res.count_unwritten() == 0 && same_bits("residual", d_res.download(), res_ref) && ok;
        ok = same_bits("mean", d_mean.download(), mean_ref) && ok;
        return same_bits("rstd", d_rstd.download(), rstd_ref) && ok;
    };
    const std::string op = lab::Lab::strprintf("fp8_layernorm_forward_cast e4m3 R=%d C=%d", R, C);
    const double bytes = (double)n * (2 * sizeof(floatX) + sizeof(floatX) + 2), flops = 8.0 * n;
    L.run(op, 0, "shipped fused", bytes, flops, lab::Bound::Memory, reset,
          [&] { layernorm_fp8_forward(d_out_t, d_out, d_res, d_mean, d_rstd, d_in1, d_in2, d_w, d_b, R, C, d_meta, L.ctx); },
          check);
    L.run(op, 1, "separate passes", bytes, flops, lab::Bound::Memory, reset,
          [&] {
              fused_residual_layernorm_forward(d_res, d_ln, d_mean, d_rstd, d_in1, d_in2, d_w, d_b, R, C, L.stream());
              fp8_cast_transpose(d_out_t, d_out, d_ln, R, C, Fp8Format::E4M3, d_meta, true, L.stream());
          },
          check);
    L.run(op, 2, "previous: passes over the row in memory", bytes, flops, lab::Bound::Memory, reset,
          [&] {
              fp8_lab::layernorm_fp8_in_memory(d_out_t, d_out, d_res, d_mean, d_rstd, d_in1, d_in2, d_w, d_b, R, C,
                                               d_meta, L.ctx);
          },
          check);
}

// ---------------------------------------------------------------- fp8_transpose (bytes, see the top)
// One buffer of `total` bytes holds the input (R, C) at in_off with in_pitch bytes a row and the output
// (C, R) at out_off with out_pitch bytes a row; every other byte of it must come out as it went in.
struct TransposeLayout {
    int R, C;
    int64_t in_pitch, out_pitch;
    size_t in_off, out_off, total;
};
static void run_transpose(lab::Lab& L, const std::string& op, const TransposeLayout& t, uint64_t seed) {
    // the whole buffer before: input bytes in [0, 254], everything else the poison 0xFF (never an
    // input byte, so a byte the kernel fails to write cannot match); after: the output region transposed
    std::vector<uint8_t> img(t.total, lab::POISON_BYTE);
#pragma omp parallel for
    for (int r = 0; r < t.R; r++)
        for (int c = 0; c < t.C; c++) {
            uint64_t h = seed ^ (((uint64_t)r << 32) | (uint32_t)c);  // splitmix64 of (seed, r, c)
            h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
            h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
            img[t.in_off + r * t.in_pitch + c] = (uint8_t)((h ^ (h >> 31)) % 255);
        }
    lab::DevBuf<uint8_t> d_buf(t.total, "buffer"), d_init(t.total, "init"), d_want(t.total, "want");
    cudaCheck(cudaMemcpy(d_init.get(), img.data(), t.total, cudaMemcpyHostToDevice));
#pragma omp parallel for
    for (int c0 = 0; c0 < t.C; c0 += 64)
        for (int r = 0; r < t.R; r++)
            for (int c = c0; c < c0 + 64; c++) img[t.out_off + c * t.out_pitch + r] = img[t.in_off + r * t.in_pitch + c];
    cudaCheck(cudaMemcpy(d_want.get(), img.data(), t.total, cudaMemcpyHostToDevice));
    std::vector<uint8_t>().swap(img);
    const uint8_t* in = d_buf.get() + t.in_off;
    uint8_t* out = d_buf.get() + t.out_off;
    auto reset = [&] {
        cudaCheck(cudaMemcpyAsync(d_buf.get(), d_init.get(), t.total, cudaMemcpyDeviceToDevice, L.stream()));
    };
    auto check = [&] {
        const lab::ByteDiff d = lab::diff_bytes(d_buf, d_want, 1, (int64_t)t.total, 0, (int64_t)t.total);
        const unsigned long long diff[2] = {d.count, d.first};
        bool ok = d_buf.guard_intact();
        if (!ok) printf("    %-10s FAIL: the kernel wrote into the guard region after the buffer\n", "buffer");
        if (diff[0] == 0) {
            printf("    %-10s %zu bytes as expected (%zu transposed, the rest untouched)  ok\n", "buffer", t.total,
                   (size_t)t.R * t.C);
            return ok;
        }
        uint8_t got, want;
        cudaCheck(cudaMemcpy(&got, d_buf.get() + diff[1], 1, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(&want, d_want.get() + diff[1], 1, cudaMemcpyDeviceToHost));
        // where the first one is: an output element (row c, byte r), or a byte outside the output
        const int64_t o = (int64_t)diff[1] - (int64_t)t.out_off;
        const int64_t oc = o >= 0 ? o / t.out_pitch : -1, orow = o >= 0 ? o % t.out_pitch : -1;
        if (oc >= 0 && oc < t.C && orow < t.R)
            printf("    %-10s FAIL: %llu bytes differ; first: output row %lld byte %lld (input (%lld, %lld)): got 0x%02X "
                   "want 0x%02X%s\n", "buffer", diff[0], (long long)oc, (long long)orow, (long long)orow, (long long)oc,
                   got, want, got == lab::POISON_BYTE ? " (never written)" : "");
        else
            printf("    %-10s FAIL: %llu bytes differ; first at byte %llu, outside the output: got 0x%02X want 0x%02X\n",
                   "buffer", diff[0], diff[1], got, want);
        return false;
    };
    const double bytes = 2.0 * t.R * t.C, flops = 0.0;
    auto variant = [&](int v, const char* what, fp8_lab::Fp8TransposeConfig cfg) {
        L.run(op, v, what, bytes, flops, lab::Bound::Memory, reset,
              [&] { fp8_lab::transpose_launch(out, t.out_pitch, in, t.in_pitch, t.R, t.C, L.stream(), cfg); }, check);
    };
    L.run(op, 0, "shipped 128x128, groups of 32", bytes, flops, lab::Bound::Memory, reset,
          [&] { fp8_transpose(out, t.out_pitch, in, t.in_pitch, t.R, t.C, L.stream()); }, check);
    variant(1, "previous 64 cols x 128 rows", {128, 0, true});
    variant(2, "128x128, row after row", {128, 0, false});
    variant(3, "128x128, groups of 8", {128, 8, false});
    variant(4, "256 rows x 128, groups of 32", {256, 32, false});
    variant(5, "256 rows x 128, row after row", {256, 0, false});
}

// --op NAME (before the harness's flags are read): only that op family, e.g. fp8_dq_cast (its inputs
// and references built alone, so it is timed alone on the GPU).
int main(int argc, char** argv) {
    const char* families[] = {"fp8_cast", "fp8_gelu_forward_cast", "fp8_gelu_backward_cast", "fp8_cast_dbias",
                              "fp8_layernorm_forward_cast", "fp8_dq_cast", "fp8_transpose"};
    const char* only = nullptr;
    std::vector<char*> args;  // argv without --op NAME: the harness's
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--op")) {
            if (i + 1 >= argc) fail("fp8_cast.cu: --op needs an op name (fp8_cast, fp8_dq_cast, ...)");
            only = argv[++i];
            if (std::none_of(std::begin(families), std::end(families), [&](const char* f) { return !strcmp(f, only); }))
                fail("fp8_cast.cu: --op %s: no such op (fp8_cast, fp8_gelu_forward_cast, fp8_gelu_backward_cast, "
                     "fp8_cast_dbias, fp8_layernorm_forward_cast, fp8_dq_cast, fp8_transpose)", only);
        } else {
            args.push_back(argv[i]);
        }
    }
    auto on = [&](const char* family) { return !only || !strcmp(only, family); };
    lab::Lab L((int)args.size(), args.data(), "fp8_cast.cu");
    const int N = lab::GPT2_B * lab::GPT2_T, C = lab::GPT2_C;
    const Shape big[] = {{lab::Lab::strprintf("R=%d C=%d", N, C), N, C, true},
                         {lab::Lab::strprintf("R=%d C=%d", N, 4 * C), N, 4 * C, true}};
    const Shape all_bf16 = {"every-bf16 R=1024 C=64", 1024, 64, true};
    const int odd_n = lab::ODD_B * lab::ODD_T * 776 + 3;
    const Shape odd = {lab::Lab::strprintf("n=%d", odd_n), 1, odd_n, false};
    const std::vector<float> every = every_bf16();
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        if (!on("fp8_cast")) continue;
        for (const Shape& s : big) run_shape(L, s, f, lab::rand_uniform((size_t)s.R * s.C, 61, -3.0f, 3.0f), 0.0f);
        run_shape(L, odd, f, lab::rand_uniform((size_t)odd_n, 62, -3.0f, 3.0f), 0.0f);
        run_shape(L, {all_bf16.name + " scale=1", all_bf16.R, all_bf16.C, true}, f, every, 1.0f);
        run_shape(L, {all_bf16.name + " scale=0.3", all_bf16.R, all_bf16.C, true}, f, every, 0.3f);
    }
    // the fused casts (llmc/fp8_fused.cuh): the trainer's shapes, then an awkward row count
    for (int R : {N, 192}) {
        if (on("fp8_gelu_forward_cast"))
            run_fused(L, "fp8_gelu_forward_cast", Fp8Prologue::GELU_FORWARD, R, 4 * C, Fp8Format::E4M3, 71);
        for (Fp8Format f : {Fp8Format::E5M2, Fp8Format::E4M3})
            if (on("fp8_gelu_backward_cast"))
                run_fused(L, "fp8_gelu_backward_cast", Fp8Prologue::GELU_BACKWARD, R, 4 * C, f, 72);
        for (int width : {C, 3 * C})
            if (on("fp8_cast_dbias")) run_fused(L, "fp8_cast_dbias", Fp8Prologue::NONE, R, width, Fp8Format::E5M2, 73);
        if (on("fp8_layernorm_forward_cast")) run_layernorm_fp8(L, R, R == N ? C : 320, 74);
#if !defined(PRECISION_FP32)
        if (on("fp8_dq_cast")) run_dq_cast(L, R, R == N ? lab::GPT2_C / 64 : 3, Fp8Format::E5M2, 75);
#endif
    }
    {  // GPT-2 774M at B = 16, T = 1024 (C = 1280): the fused casts of its step
        const int Rl = 16 * 1024, Cl = 1280;
        if (on("fp8_gelu_forward_cast"))
            run_fused(L, "fp8_gelu_forward_cast", Fp8Prologue::GELU_FORWARD, Rl, 4 * Cl, Fp8Format::E4M3, 76);
        if (on("fp8_gelu_backward_cast"))
            run_fused(L, "fp8_gelu_backward_cast", Fp8Prologue::GELU_BACKWARD, Rl, 4 * Cl, Fp8Format::E5M2, 77);
        if (on("fp8_cast_dbias")) run_fused(L, "fp8_cast_dbias", Fp8Prologue::NONE, Rl, Cl, Fp8Format::E5M2, 78);
        if (on("fp8_layernorm_forward_cast")) run_layernorm_fp8(L, Rl, Cl, 80);
#if !defined(PRECISION_FP32)
        if (on("fp8_dq_cast")) run_dq_cast(L, Rl, Cl / 64, Fp8Format::E5M2, 79);
#endif
    }
    if (on("fp8_transpose")) {
        // the head's dlogits^T chunk: tokens (R) x vocabulary rows (C) in the first halves of the 2 Vp-byte
        // logits rows, transposed into their second halves (llmc/model_fp8.cuh, fp8_head_backward)
        const int Vp = lab::GPT2_VP, Rh = N / 2;
        const int64_t pitch = 2 * (int64_t)Vp;
        run_transpose(L, lab::Lab::strprintf("fp8_transpose R=%d C=%d pitch=%lld", Rh, Vp, (long long)pitch),
                      {Rh, Vp, pitch, pitch, 0, (size_t)Vp, (size_t)std::max(Rh, Vp) * pitch}, 81);
        // awkward: R and C odd multiples of 64, pitches not multiples of 128, separate regions
        const int Ra = 192, Ca = 320;
        const int64_t ip = Ca + 48, op = Ra + 16;
        const size_t in_off = 16, out_off = in_off + Ra * ip + 48;
        run_transpose(L, lab::Lab::strprintf("fp8_transpose R=%d C=%d pitches %lld %lld", Ra, Ca, (long long)ip,
                                             (long long)op),
                      {Ra, Ca, ip, op, in_off, out_off, out_off + Ca * op + 32}, 82);
    }
    return L.finish();
}
