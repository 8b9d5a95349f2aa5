// layernorm.cu: LayerNorm (llmc/layernorm.cuh), forward, the fused residual + LayerNorm forward and
// the backward, against cpu::layernorm_forward / cpu::layernorm_backward (llmc/cpu/layernorm.h).
//   ./layernorm [variant ...] [--check-only] [--reps N]
// Shapes: GPT-2 124M (N = B*T = 65536 rows, C = 768), the awkward N = 651, C = 776, and the wide
// rows of GPT-2 774M and 1.5B at N = 16384 (C = 1280: 5 packs per lane in bf16; C = 1600: 6.25, the
// last pack on 8 of 32 lanes).
// Bytes counted (each input read once, each output written once): forward N*C in + N*C out + 8N
// statistics; fused forward 2 N*C in, 2 N*C out; backward dout and inp in, dinp read and written.
//
// Variants (H200, bf16, N=65536 C=768, 2026-12-02, one run; % of the 4.0 TB/s copy):
//   forward        0 shipped: layernorm_forward_warp_per_row, 3 passes over the row   0.062 ms, 81%
//   forward        1 registers: warp per row, the row held in registers, 1 pass       0.071 ms, 71%
//                  (rejected: the shipped re-reads hit L1; holding 4 packs per lane costs occupancy)
//   fused forward  0 shipped: residual add + LayerNorm in one kernel                  0.108 ms, 94%
//   backward       0 shipped: warp-per-row dinp + fixed-order column partials         0.201 ms, 50%
//                  (the headroom: dout and inp are read twice, once per kernel; 25 calls per step)
//   backward       1 one pass: dinp and the chunk partials from one read of dout/inp  0.184 ms, 55%
//                  (expected ~0.14 ms from 4 instead of 6 N*C*sizeof(floatX) bytes; got -8% at
//                  GPT-2's shape and +13% at the awkward one: not promoted; its dinp load waits for
//                  the row's reduction, two DRAM round trips per row)
//   backward       2 two kernels: the "0 shipped" above, kept in layernorm.cuh as the C > 1024 fallback
//   backward       0 shipped (since the normbwd branch): layernorm_backward_fused, one kernel, every
//                  load of a row (dout, inp, dinp) issued before its reductions, the row held in
//                  registers, dweight and dbias sums per lane in registers, 256 chunks of rows = 256
//                  blocks of 8 warps (one wave at 2 blocks/SM on 132 SMs; 128 registers at C = 768, no
//                  spills), then column_partials_add for dweight and dbias (the measured version below
//                  had one fold kernel for both: ~1-2 us a call).
//                  DRAM: 4 N*C*2 B = 403 MB once; expected >= 85% of copy (one DRAM round trip per
//                  row, 16 warps x 9 16-byte loads per lane = 74 KB in flight per SM) + ~2-3 us of fold.
//                  measured: 0.1259 ms, 80.0% of copy at N=65536 C=768 (H200, commit b0218d8; the two
//                  kernels: 49.9%); 0.0205 ms at N=651 C=776
//   backward       3 fused R=1: variant 0's kernel with one row per warp step at every width (at
//                  C = 768 in bf16 the same kernel as variant 0)
//                  measured: 0.1262 ms, 79.9% of copy (b0218d8)
//   backward       4 fused R=2: two rows per warp step (at C = 768: over 128 registers, 604 B of spills)
//                  measured: 0.1731 ms, 58.2% of copy (b0218d8)
//   At 1024 < C <= 2048 (bf16; the lab's N=16384 C=1280 and C=1600, GPT-2 774M and 1.5B widths;
//   variants 1, 3 and 4 and the forward's 1 cover C <= 1024 only and are not run there):
//   backward       0 shipped: layernorm_backward_fused<5..8, 1>, the wide regime: the narrow kernel's
//                  loads and math, the dweight/dbias sums in dynamic shared memory (each lane its own
//                  16-byte slots, read-add-write per row; 80 KB at C = 1280, 100 KB at 1600), the loaded
//                  packs kept across the row's reductions and phase 2 recomputed from them: at 5
//                  packs 128 registers, 2 blocks of 8 warps per SM, 264 chunks; at 6-8 packs 1 block
//                  per SM (191-238 registers, no spills), 132 chunks. DRAM: 4 N*C*2 B = 168 MB at
//                  C = 1280 (42 us at the copy), 210 MB at 1600 (52 us). H200 2026-12-04:
//                  C = 1280 0.0755 ms (55.6% of copy), C = 1600 0.0847 ms (61.9%); at 2 blocks per SM
//                  for every width, C = 1600 spilled 376 bytes and took 0.1679 ms. Its first version
//                  (t and norm in registers, 180-223 registers, 1 block per SM, 132 chunks), H200
//                  2026-12-04: C = 1280 0.0897 ms (46.8% of copy), C = 1600 0.1175 ms (44.6%); 73.7 us
//                  a call in the 774M step (the two kernels: 44.8 + 36.0)
//   backward       2 two kernels: the fallback above 2048 columns. H200 2026-12-04: C = 1280 0.0990 ms
//                  (42.4%), C = 1600 0.1280 ms (41.0%); an earlier call 0.1074 and 0.1348
//   backward       5 fused wide, 256 chunks: variant 0's wide kernel at 256 chunks: 0.0748 ms (1280),
//                  0.0848 (1600), as variant 0. The first version at 256 chunks: 0.0916 ms, 0.1206
// Small M (a decode step's rows: M = 1, 8, 64 at C = 768 and the awkward C = 776), forward and fused
// forward ("... small M=" lines):
//   0 shipped for M <= NORM_ROW_MAX_M (generate, NormLaunch::block_per_row): layernorm_forward_block_per_row,
//     a block per row, one pack a thread in registers, block reductions (launched here without PDL)
//   1 the large-M kernel (warp per row, 8 rows a block): what generate ran before
//   not yet measured; the decode step's profile (B = 64, before): 6.5 us a residual+norm call
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/layernorm.h"
#include "llmc/layernorm.cuh"

// Variant 1 forward: lane i keeps packs i, i+32, ... of its row in registers (REG_PACKS of them), so
// the row is read once and mean, variance and the output come from registers. Covers C up to
// 32 * REG_PACKS * x128::size = 1024 in both precisions.
constexpr int REG_PACKS = 1024 / (WARP_SIZE * x128::size);
static __global__ void layernorm_forward_warp_registers(floatX* out, float* mean, float* rstd, const floatX* inp,
                                                        const floatX* weight, const floatX* bias, int N, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const floatX* x = inp + (int64_t)row * C;
    x128 v[REG_PACKS];
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < REG_PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C) {
            v[p] = load128cs(x + c);
            for (int k = 0; k < x128::size; k++) sum += to_float(v[p][k]);
        }
    }
    const float m = warp_reduce_sum(sum) / C;
    float sq = 0.0f;
#pragma unroll
    for (int p = 0; p < REG_PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C)
            for (int k = 0; k < x128::size; k++) { const float d = to_float(v[p][k]) - m; sq += d * d; }
    }
    const float s = rsqrtf(warp_reduce_sum(sq) / C + LAYERNORM_EPS);
#pragma unroll
    for (int p = 0; p < REG_PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C) {
            const x128 w = load128(weight + c), b = load128(bias + c);
            x128 o;
            for (int k = 0; k < x128::size; k++)
                o[k] = from_float<floatX>((to_float(v[p][k]) - m) * s * to_float(w[k]) + to_float(b[k]));
            store128cs(out + (int64_t)row * C + c, o);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// Variant 1 backward: one pass over dout and inp instead of the shipped two (dinp kernel, then the
// parameter partials). Block = one chunk of rows (the shipped chunking, column_num_chunks); warp w
// takes rows w, w+8, ... of it. Each lane keeps its columns' dweight/dbias sums in registers, the
// warps fold them into shared memory in warp order (deterministic), and the block writes the chunk's
// partials in the layout column_partials_add reads: (chunks, 2, C). The row is read twice, as in
// the shipped kernel, the second time from L1. DRAM: dout and inp once, dinp read and written:
// 4 N*C*sizeof(floatX) instead of 6. PACKS = packs per lane (3 at C = 768 in bf16); 2 blocks per SM
// caps it at 128 registers (holding the row in registers too needed 215, or spilled under the cap).
template <int PACKS>
static __global__ __launch_bounds__(LAYERNORM_BLOCK, 2) void layernorm_backward_one_pass(
    floatX* dinp, float* partials, const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
    const float* rstd, int N, int C, int rows_per_chunk) {
    __shared__ float acc[2][1024];  // dweight, dbias sums of this chunk; C <= 1024
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    const int r0 = blockIdx.x * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float dw[PACKS][x128::size] = {}, db[PACKS][x128::size] = {};
    x128 w[PACKS];
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C) w[p] = load128(weight + c);
    }
    for (int r = r0 + warp; r < r1; r += warps) {
        const int64_t base = (int64_t)r * C;
        const float m = mean[r], s = rstd[r];
        float sum_g = 0.0f, sum_gn = 0.0f;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c = (p * WARP_SIZE + lane) * x128::size;
            if (c < C) {
                const x128 d = load128(dout + base + c), x = load128(inp + base + c);
                for (int k = 0; k < x128::size; k++) {
                    const float g = to_float(d[k]) * to_float(w[p][k]);
                    sum_g += g;
                    sum_gn += g * (to_float(x[k]) - m) * s;
                }
            }
        }
        const float mean_g = warp_reduce_sum(sum_g) / C, mean_gn = warp_reduce_sum(sum_gn) / C;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c = (p * WARP_SIZE + lane) * x128::size;
            if (c < C) {
                const x128 d = load128(dout + base + c), x = load128(inp + base + c);  // L1 hits
                x128 di = load128(dinp + base + c);
                for (int k = 0; k < x128::size; k++) {
                    const float dk = to_float(d[k]), norm = (to_float(x[k]) - m) * s;
                    di[k] = from_float<floatX>(to_float(di[k]) + s * (dk * to_float(w[p][k]) - mean_g - norm * mean_gn));
                    dw[p][k] += dk * norm;
                    db[p][k] += dk;
                }
                store128(dinp + base + c, di);
            }
        }
    }
    for (int turn = 0; turn < warps; turn++) {
        if (warp == turn) {
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const int c = (p * WARP_SIZE + lane) * x128::size;
                if (c < C)
                    for (int k = 0; k < x128::size; k++) {
                        acc[0][c + k] = (turn == 0 ? 0.0f : acc[0][c + k]) + dw[p][k];
                        acc[1][c + k] = (turn == 0 ? 0.0f : acc[1][c + k]) + db[p][k];
                    }
            }
        }
        __syncthreads();
    }
    float* out = partials + (int64_t)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        out[c] = acc[0][c];
        out[C + c] = acc[1][c];
    }
}

static void run_shape(lab::Lab& L, int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const size_t NC = (size_t)N * C, s = sizeof(floatX);
    std::vector<float> inp = lab::rand_uniform(NC, 21, -2.0f, 2.0f);     // (N, C)
    std::vector<float> inp2 = lab::rand_uniform(NC, 22);                  // (N, C) the residual branch
    std::vector<float> weight = lab::rand_uniform(C, 23, 0.5f, 1.5f);     // (C)
    std::vector<float> bias = lab::rand_uniform(C, 24);                   // (C)
    std::vector<float> dout = lab::rand_uniform(NC, 25);                  // (N, C)
    std::vector<float> dinp0 = lab::rand_uniform(NC, 26, -0.1f, 0.1f);    // += starts here
    std::vector<float> dweight0 = lab::rand_uniform(C, 27), dbias0 = lab::rand_uniform(C, 28);

    lab::DevBuf<floatX> d_inp(NC, "inp"), d_inp2(NC, "inp2"), d_weight(C, "weight"), d_bias(C, "bias");
    lab::DevBuf<floatX> d_out(NC, "out"), d_residual(NC, "residual");
    lab::DevBuf<float> d_mean(N, "mean"), d_rstd(N, "rstd");
    d_inp.upload(inp);
    d_inp2.upload(inp2);
    d_weight.upload(weight);
    d_bias.upload(bias);
    const lab::Tol stat_tol = {1e-4, 1e-4};  // fp32 statistics of identical inputs

    // ---- forward
    std::vector<float> ref_out(NC), ref_mean(N), ref_rstd(N);
    cpu::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(), weight.data(), bias.data(), 1,
                           N, C);
    auto reset_fwd = [&] {
        d_out.poison(L.stream());
        d_mean.poison(L.stream());
        d_rstd.poison(L.stream());
    };
    auto check_fwd = [&] {
        bool ok = L.check(d_out, ref_out);
        ok = L.check(d_mean, ref_mean, stat_tol) && ok;
        return L.check(d_rstd, ref_rstd, stat_tol) && ok;
    };
    const double fwd_bytes = 2.0 * NC * s + 8.0 * N + 2.0 * C * s;
    L.run("layernorm_forward" + shape, 0, "shipped", fwd_bytes, 8.0 * NC, lab::Bound::Memory, reset_fwd,
          [&] { layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, L.stream()); }, check_fwd);
    if (C <= WARP_SIZE * REG_PACKS * x128::size)  // its register budget
    L.run("layernorm_forward" + shape, 1, "registers", fwd_bytes, 8.0 * NC, lab::Bound::Memory, reset_fwd, [&] {
        const int rows_per_block = LAYERNORM_BLOCK / WARP_SIZE;
        layernorm_forward_warp_registers<<<ceil_div(N, rows_per_block), LAYERNORM_BLOCK, 0, L.stream()>>>(
            d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C);
    }, check_fwd);

    // ---- fused residual + forward: the residual is rounded to floatX before it is normalized
    std::vector<float> ref_residual(NC), ref_fout(NC), ref_fmean(N), ref_frstd(N);
    for (size_t i = 0; i < NC; i++) ref_residual[i] = inp[i] + inp2[i];
    lab::round_to<floatX>(ref_residual);
    cpu::layernorm_forward(ref_fout.data(), ref_fmean.data(), ref_frstd.data(), ref_residual.data(), weight.data(),
                           bias.data(), 1, N, C);
    L.run("fused_residual_layernorm_forward" + shape, 0, "shipped", 4.0 * NC * s + 8.0 * N + 2.0 * C * s, 9.0 * NC,
          lab::Bound::Memory, [&] { reset_fwd(); d_residual.poison(L.stream()); },
          [&] {
              fused_residual_layernorm_forward(d_residual, d_out, d_mean, d_rstd, d_inp, d_inp2, d_weight, d_bias, N, C,
                                               L.stream());
          },
          [&] {
              bool ok = L.check(d_residual, ref_residual);
              ok = L.check(d_out, ref_fout) && ok;
              ok = L.check(d_mean, ref_fmean, stat_tol) && ok;
              return L.check(d_rstd, ref_frstd, stat_tol) && ok;
          });

    // ---- backward (+=), with the reference's fp32 statistics as the saved mean/rstd
    std::vector<float> ref_dinp = dinp0, ref_dweight = dweight0, ref_dbias = dbias0;
    cpu::layernorm_backward(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), inp.data(),
                            weight.data(), ref_mean.data(), ref_rstd.data(), 1, N, C);
    lab::DevBuf<floatX> d_dout(NC, "dout"), d_dinp(NC, "dinp"), d_dweight(C, "dweight"), d_dbias(C, "dbias");
    lab::DevBuf<float> d_scratch(layernorm_backward_scratch_floats(N, C), "scratch");
    d_dout.upload(dout);
    d_mean.upload(ref_mean);
    d_rstd.upload(ref_rstd);
    const double bwd_bytes = 4.0 * NC * s + 8.0 * N + 6.0 * C * s;
    auto reset_bwd = [&] {
        d_dinp.upload(dinp0);
        d_dweight.upload(dweight0);
        d_dbias.upload(dbias0);
    };
    auto check_bwd = [&] {
        bool ok = L.check(d_dinp, ref_dinp);
        ok = L.check(d_dweight, ref_dweight) && ok;
        return L.check(d_dbias, ref_dbias) && ok;
    };
    auto launch_bwd0 = [&] {
        layernorm_backward(d_dinp, d_dweight, d_dbias, d_scratch, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C,
                           L.ctx);
    };
    // variant 0 runs a second time from the same start: dinp, dweight and dbias must be bit-identical
    auto check_bwd_repeat = [&] {
        bool ok = check_bwd();
        const std::vector<float> a[3] = {d_dinp.download(), d_dweight.download(), d_dbias.download()};
        reset_bwd();
        launch_bwd0();
        cudaCheck(cudaStreamSynchronize(L.stream()));
        const std::vector<float> b[3] = {d_dinp.download(), d_dweight.download(), d_dbias.download()};
        bool same = true;
        for (int i = 0; i < 3; i++)
            same = same && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0;
        printf("    %-10s %s\n", "repeat", same ? "ok: bit-identical to the first run" : "FAIL: not bit-identical");
        return same && ok;
    };
    L.run("layernorm_backward" + shape, 0, "shipped", bwd_bytes, 15.0 * NC, lab::Bound::Memory, reset_bwd, launch_bwd0,
          check_bwd_repeat);
    const bool narrow = C <= WARP_SIZE * NORM_BWD_REG_PACKS * x128::size;  // C <= 1024
    if (narrow)  // variant 1's 1024-column budget
    L.run("layernorm_backward" + shape, 1, "one pass", bwd_bytes, 15.0 * NC, lab::Bound::Memory, reset_bwd, [&] {
        const int chunks = column_num_chunks(N), rows_per_chunk = ceil_div(N, chunks);
        const int packs = ceil_div(C / x128::size, WARP_SIZE);
        auto kernel = packs <= 1   ? layernorm_backward_one_pass<1>
                      : packs == 2 ? layernorm_backward_one_pass<2>
                      : packs == 3 ? layernorm_backward_one_pass<3>
                                   : layernorm_backward_one_pass<REG_PACKS>;
        kernel<<<chunks, LAYERNORM_BLOCK, 0, L.stream()>>>(d_dinp, d_scratch, d_dout, d_inp, d_weight, d_mean, d_rstd, N,
                                                         C, rows_per_chunk);
        column_partials_add(d_dweight.get(), d_scratch.get(), chunks, 2 * (int64_t)C, C, L.stream());
        column_partials_add(d_dbias.get(), d_scratch.get() + C, chunks, 2 * (int64_t)C, C, L.stream());
    }, check_bwd);
    L.run("layernorm_backward" + shape, 2, "two kernels", bwd_bytes, 15.0 * NC, lab::Bound::Memory, reset_bwd, [&] {
        norm_backward_two_kernels<LayerNormBackward>(d_dinp, d_dweight, d_dbias, d_scratch, N, C, L.stream(), d_dout,
                                                     d_inp, d_weight, d_mean.get(), d_rstd.get());
    }, check_bwd);
    // the shipped kernel with R = 1 and R = 2 rows per warp step at every narrow width (the launcher
    // picks R = 2 up to 2 packs per lane, i.e. C <= 512 in bf16, and R = 1 above; the wide kernels
    // take R = 1, variant 0)
    for (const int R : {1, 2}) {
        if (!narrow) break;
        L.run("layernorm_backward" + shape, 2 + R, R == 1 ? "fused R=1" : "fused R=2", bwd_bytes, 15.0 * NC,
              lab::Bound::Memory, reset_bwd, [&] {
                  norm_backward_dispatch(C, [&](auto packs) {
                      constexpr int P = decltype(packs)::value;
                      if constexpr (!norm_backward_wide<P>()) {
                          auto launch = [&](auto r) {
                              norm_backward_fused_launch<LayerNormBackward, P, decltype(r)::value>(
                                  d_dinp, d_dweight, d_dbias, d_scratch, N, C, L.ctx, 0, d_dout, d_inp, d_weight,
                                  d_mean.get(), d_rstd.get());
                          };
                          if (R == 1) launch(std::integral_constant<int, 1>{});
                          else launch(std::integral_constant<int, 2>{});
                      }
                  });
              }, check_bwd);
    }
    // the wide kernel (variant 0 above 1024 columns) with 256 chunks instead of its 132: two waves of
    // 1 block per SM against one
    if (!narrow && C <= NORM_BWD_MAX_C)
        L.run("layernorm_backward" + shape, 5, "fused wide, 256 chunks", bwd_bytes, 15.0 * NC, lab::Bound::Memory,
              reset_bwd, [&] {
                  norm_backward_dispatch(C, [&](auto packs) {
                      constexpr int P = decltype(packs)::value;
                      norm_backward_fused_launch<LayerNormBackward, P, norm_backward_rows<P>()>(
                          d_dinp, d_dweight, d_dbias, d_scratch, N, C, L.ctx,
                          std::min(NORM_BWD_MAX_CHUNKS, column_num_chunks(N)), d_dout, d_inp, d_weight, d_mean.get(),
                          d_rstd.get());
                  });
              }, check_bwd);
}

// A decode step's M rows: the forward and the fused forward, the small-M kernel (0) against the
// large-M one (1), both checked against the CPU reference.
static void run_small(lab::Lab& L, int M, int C) {
    const std::string shape = " small M=" + std::to_string(M) + " C=" + std::to_string(C);
    const size_t NC = (size_t)M * C, s = sizeof(floatX);
    const uint64_t seed = 100 + 7 * (uint64_t)M + C;
    std::vector<float> inp = lab::rand_uniform(NC, seed, -2.0f, 2.0f), inp2 = lab::rand_uniform(NC, seed + 1);
    std::vector<float> weight = lab::rand_uniform(C, seed + 2, 0.5f, 1.5f), bias = lab::rand_uniform(C, seed + 3);
    lab::DevBuf<floatX> d_inp(NC, "inp"), d_inp2(NC, "inp2"), d_weight(C, "weight"), d_bias(C, "bias");
    lab::DevBuf<floatX> d_out(NC, "out"), d_residual(NC, "residual");
    lab::DevBuf<float> d_mean(M, "mean"), d_rstd(M, "rstd");
    d_inp.upload(inp);
    d_inp2.upload(inp2);
    d_weight.upload(weight);
    d_bias.upload(bias);
    const lab::Tol stat_tol = {1e-4, 1e-4};
    auto reset = [&] {
        d_out.poison(L.stream());
        d_residual.poison(L.stream());
        d_mean.poison(L.stream());
        d_rstd.poison(L.stream());
    };
    std::vector<float> ref_out(NC), ref_mean(M), ref_rstd(M);
    cpu::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(), weight.data(), bias.data(), 1,
                           M, C);
    auto check_fwd = [&] {
        bool ok = L.check(d_out, ref_out);
        ok = L.check(d_mean, ref_mean, stat_tol) && ok;
        return L.check(d_rstd, ref_rstd, stat_tol) && ok;
    };
    const double fwd_bytes = 2.0 * NC * s + 8.0 * M + 2.0 * C * s;
    for (const int v : {0, 1})
        L.run("layernorm_forward" + shape, v, v == 0 ? "shipped small M: block per row" : "warp per row (large M)",
              fwd_bytes, 8.0 * NC, lab::Bound::Memory, reset, [&] {
                  layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, M, C, L.stream(),
                                    NormLaunch{v == 0, false});
              }, check_fwd);
    std::vector<float> ref_residual(NC), ref_fout(NC), ref_fmean(M), ref_frstd(M);
    for (size_t i = 0; i < NC; i++) ref_residual[i] = inp[i] + inp2[i];
    lab::round_to<floatX>(ref_residual);
    cpu::layernorm_forward(ref_fout.data(), ref_fmean.data(), ref_frstd.data(), ref_residual.data(), weight.data(),
                           bias.data(), 1, M, C);
    for (const int v : {0, 1})
        L.run("fused_residual_layernorm_forward" + shape, v,
              v == 0 ? "shipped small M: block per row" : "warp per row (large M)",
              4.0 * NC * s + 8.0 * M + 2.0 * C * s, 9.0 * NC, lab::Bound::Memory, reset, [&] {
                  fused_residual_layernorm_forward(d_residual, d_out, d_mean, d_rstd, d_inp, d_inp2, d_weight, d_bias,
                                                   M, C, L.stream(), NormLaunch{v == 0, false});
              }, [&] {
                  bool ok = L.check(d_residual, ref_residual);
                  ok = L.check(d_out, ref_fout) && ok;
                  ok = L.check(d_mean, ref_fmean, stat_tol) && ok;
                  return L.check(d_rstd, ref_frstd, stat_tol) && ok;
              });
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "layernorm.cu");
    for (const int M : {1, 8, 64})
        for (const int C : {lab::GPT2_C, 776}) run_small(L, M, C);
    run_shape(L, lab::GPT2_B * lab::GPT2_T, lab::GPT2_C);
    run_shape(L, lab::ODD_B * lab::ODD_T, 776);
    run_shape(L, 16384, 1280);  // GPT-2 774M's width, B*T = 16 x 1024
    run_shape(L, 16384, 1600);  // GPT-2 1.5B's: 6.25 packs per lane in bf16
    return L.finish();
}
