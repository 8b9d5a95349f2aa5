// rmsnorm.cu: RMSNorm (llmc/rmsnorm.cuh), forward, the fused residual + RMSNorm forward and the
// backward, against cpu::rmsnorm_forward / cpu::fused_residual_rmsnorm_forward / cpu::rmsnorm_backward
// (llmc/cpu/rmsnorm.h). eps 1e-6 (Llama 3, SmolLM).
//   ./rmsnorm [variant ...] [--check-only] [--reps N]
// Shapes: the 124M Llama-style model (N = B*T = 65536 rows, C = 768), the awkward N = 651, C = 776,
// and wide rows at N = 16384 (C = 1280: 5 packs per lane in bf16; C = 1600: 6.25, the last pack on 8
// of 32 lanes).
// Bytes counted (each input read once, each output written once): forward N*C in + N*C out + 4N
// rstd; fused forward 2 N*C in, 2 N*C out; backward dout and inp in, dinp read and written.
//
// Variants (measured on the H200 at commit 5abe2b8: docs/perf.md, "Llama-family kernels"):
//   forward        0 shipped: rmsnorm_forward_warp_per_row, 2 passes over the row (2nd from L1)
//   forward        1 block per row: one element per thread, scalar loads, block reduction (baseline)
//   forward        2 registers: warp per row, the row held in registers, 1 pass over DRAM and L1
//                  (layernorm.cu measured its version of this 10 points below its shipped kernel)
//   fused forward  0 shipped: residual add + RMSNorm in one kernel
// Small M (a decode step's rows: M = 1, 8, 64 at C = 768 and the awkward C = 776), forward and fused
// forward ("... small M=" lines):
//   0 shipped for M <= NORM_ROW_MAX_M (generate, NormLaunch::block_per_row): rmsnorm_forward_block_per_row,
//     a block per row, one 16-byte pack a thread in registers, one block reduction (here without PDL)
//   1 the large-M kernel (warp per row, 8 rows a block): what generate ran before; not yet measured
//   backward       0 shipped (since the normbwd branch): rmsnorm_backward_fused, one kernel, every
//                  load of a row (dout, inp, dinp) issued before its reduction, the row held in
//                  registers, dweight sums per lane in registers, 256 chunks of rows = 256 blocks of 8
//                  warps (one wave at 2 blocks/SM on 132 SMs; 113 registers at C = 768), then
//                  column_partials_add (the measured version below had its own fold kernel, 32 chunk
//                  lanes instead of 8: ~1-2 us a call).
//                  DRAM: 4 N*C*2 B = 403 MB, the lab's byte count, once; expected >= 85% of copy
//                  (one DRAM round trip per row; 16 warps x 9 16-byte loads per lane = 74 KB in
//                  flight per SM, the order of the forward kernels' that reach 81-90%) + ~2-3 us of fold.
//                  measured: 0.1135 ms, 88.8% of copy at N=65536 C=768 (H200, commit b0218d8); 0.0156 ms
//                  at N=651 C=776
//   backward       1 one pass: dinp and the chunk partials from one read of dout/inp, 512 chunks, the
//                  dinp load after the reduction (two round trips per row), the second read of
//                  dout/inp from L1: 61.8% of copy at commit 5abe2b8
//   backward       2 two kernels (the shipped path until normbwd; still the C > 1024 fallback):
//                  warp-per-row dinp + fixed-order column partials re-reading dout/inp: 6 N*C*2 B
//                  of DRAM, 52.8% of copy at commit 5abe2b8 (as "0 shipped")
//   backward       3 fused R=1: variant 0's kernel with one row per warp step at every width (at
//                  C = 768 in bf16 the same kernel as variant 0)
//                  measured: 0.1135 ms, 88.7% of copy (b0218d8)
//   backward       4 fused R=2: two rows per warp step (twice the loads in flight per warp; at C = 768
//                  it needs 168 registers, capped at 128: 272 B of spills per thread)
//                  measured: 0.1315 ms, 76.6% of copy (b0218d8): the spills cost more than the extra
//                  loads buy
//   At 1024 < C <= 2048 (bf16; the lab's N=16384 C=1280 and C=1600; variants 1, 3 and 4 and the
//   forward's 2 cover C <= 1024 only and are not run there):
//   backward       0 shipped (the lnwide branch): rmsnorm_backward_fused<5..8, 1>, the wide regime: the
//                  narrow kernel's loads and math, the dweight sums in dynamic shared memory (each lane
//                  its own 16-byte slots, read-add-write per row; 40 KB at C = 1280, 50 KB at 1600), 1
//                  block of 8 warps per SM (199-249 registers, no spills), 132 chunks (one wave).
//                  DRAM: 4 N*C*2 B = 168 MB at C = 1280 (42 us at the copy), 210 MB at 1600 (52 us).
//                  not measured yet
//   backward       2 two kernels: the fallback above 2048 columns; not measured yet at these shapes
//   backward       5 fused wide, 256 chunks: variant 0's wide kernel at 256 chunks (two waves of 1 block
//                  per SM instead of one); not measured yet
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/rmsnorm.cuh"

constexpr float EPS = 1e-6f;
constexpr int REG_PACKS = 1024 / (WARP_SIZE * x128::size);  // packs per lane of the register variants: C <= 1024

// Variant 1: block = one row, thread = elements threadIdx.x, +blockDim.x, ... with 2-byte loads.
static __global__ void rmsnorm_forward_block_scalar(floatX* out, float* rstd, const floatX* inp,
                                                    const floatX* weight, int N, int C, float eps) {
    const int row = blockIdx.x;
    const floatX* x = inp + (int64_t)row * C;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sq += to_float(x[c]) * to_float(x[c]);
    const float s = rsqrtf(block_reduce_sum(sq) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        out[(int64_t)row * C + c] = from_float<floatX>(to_float(x[c]) * s * to_float(weight[c]));
    if (threadIdx.x == 0) rstd[row] = s;
}

// Variant 2: lane i keeps packs i, i+32, ... of its row in registers (PACKS of them, covering C up
// to 32 * PACKS * x128::size), so the row is read once.
template <int PACKS>
static __global__ void rmsnorm_forward_warp_registers(floatX* out, float* rstd, const floatX* inp,
                                                      const floatX* weight, int N, int C, float eps) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    const floatX* x = inp + (int64_t)row * C;
    x128 v[PACKS];
    float sq = 0.0f;
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C) {
            v[p] = load128cs(x + c);
            for (int k = 0; k < x128::size; k++) sq += to_float(v[p][k]) * to_float(v[p][k]);
        }
    }
    const float s = rsqrtf(warp_reduce_sum(sq) / C + eps);
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C) {
            const x128 w = load128(weight + c);
            x128 o;
            for (int k = 0; k < x128::size; k++) o[k] = from_float<floatX>(to_float(v[p][k]) * s * to_float(w[k]));
            store128(out + (int64_t)row * C + c, o);
        }
    }
    if (lane == 0) rstd[row] = s;
}

// Backward variant 1: one pass over dout and inp instead of the shipped two (dinp kernel, then the
// weight partials). Block = one chunk of rows (the shipped chunking, column_num_chunks); warp w takes
// rows w, w+8, ... of it. Each lane keeps its columns' dweight sums in registers; the warps fold them
// into shared memory in warp order (deterministic) and the block writes the chunk's partials, (chunks,
// C), for column_partials_add. The second read of a row comes from L1. DRAM: dout and inp once, dinp
// read and written: 4 N*C*sizeof(floatX) instead of the shipped 6. PACKS = packs per lane.
template <int PACKS>
static __global__ __launch_bounds__(RMSNORM_BLOCK, 2) void rmsnorm_backward_one_pass(
    floatX* dinp, float* partials, const floatX* dout, const floatX* inp, const floatX* weight, const float* rstd,
    int N, int C, int rows_per_chunk) {
    __shared__ float acc[1024];  // this chunk's dweight sums; C <= 1024
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    const int r0 = blockIdx.x * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float dw[PACKS][x128::size] = {};
    x128 w[PACKS];
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const int c = (p * WARP_SIZE + lane) * x128::size;
        if (c < C) w[p] = load128(weight + c);
    }
    for (int r = r0 + warp; r < r1; r += warps) {
        const int64_t base = (int64_t)r * C;
        const float s = rstd[r];
        float sum_gn = 0.0f;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c = (p * WARP_SIZE + lane) * x128::size;
            if (c < C) {
                const x128 d = load128(dout + base + c), x = load128(inp + base + c);
                for (int k = 0; k < x128::size; k++) sum_gn += to_float(d[k]) * to_float(w[p][k]) * to_float(x[k]) * s;
            }
        }
        const float mean_gn = warp_reduce_sum(sum_gn) / C;
#pragma unroll
        for (int p = 0; p < PACKS; p++) {
            const int c = (p * WARP_SIZE + lane) * x128::size;
            if (c < C) {
                const x128 d = load128(dout + base + c), x = load128(inp + base + c);  // L1 hits
                x128 di = load128(dinp + base + c);
                for (int k = 0; k < x128::size; k++) {
                    const float dk = to_float(d[k]), n = to_float(x[k]) * s;
                    di[k] = from_float<floatX>(to_float(di[k]) + s * (dk * to_float(w[p][k]) - n * mean_gn));
                    dw[p][k] += dk * n;
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
                    for (int k = 0; k < x128::size; k++) acc[c + k] = (turn == 0 ? 0.0f : acc[c + k]) + dw[p][k];
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) partials[(int64_t)blockIdx.x * C + c] = acc[c];
}

static void run_shape(lab::Lab& L, int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const size_t NC = (size_t)N * C, s = sizeof(floatX);
    std::vector<float> inp = lab::rand_uniform(NC, 41, -2.0f, 2.0f);    // (N, C)
    std::vector<float> inp2 = lab::rand_uniform(NC, 42);                 // (N, C) the residual branch
    std::vector<float> weight = lab::rand_uniform(C, 43, 0.5f, 1.5f);    // (C)
    std::vector<float> dout = lab::rand_uniform(NC, 44);                 // (N, C)
    std::vector<float> dinp0 = lab::rand_uniform(NC, 45, -0.1f, 0.1f);   // += starts here
    std::vector<float> dweight0 = lab::rand_uniform(C, 46);

    lab::DevBuf<floatX> d_inp(NC, "inp"), d_inp2(NC, "inp2"), d_weight(C, "weight");
    lab::DevBuf<floatX> d_out(NC, "out"), d_residual(NC, "residual");
    lab::DevBuf<float> d_rstd(N, "rstd");
    d_inp.upload(inp);
    d_inp2.upload(inp2);
    d_weight.upload(weight);
    const lab::Tol stat_tol = {1e-4, 1e-4};  // fp32 statistics of identical inputs

    // ---- forward
    std::vector<float> ref_out(NC), ref_rstd(N);
    cpu::rmsnorm_forward(ref_out.data(), ref_rstd.data(), inp.data(), weight.data(), 1, N, C, EPS);
    auto reset_fwd = [&] {
        d_out.poison(L.stream());
        d_rstd.poison(L.stream());
    };
    auto check_fwd = [&] {
        bool ok = L.check(d_out, ref_out);
        return L.check(d_rstd, ref_rstd, stat_tol) && ok;
    };
    const double fwd_bytes = 2.0 * NC * s + 4.0 * N + C * s, fwd_flops = 3.0 * NC;
    L.run("rmsnorm_forward" + shape, 0, "shipped", fwd_bytes, fwd_flops, lab::Bound::Memory, reset_fwd,
          [&] { rmsnorm_forward(d_out, d_rstd, d_inp, d_weight, N, C, EPS, L.stream()); }, check_fwd);
    L.run("rmsnorm_forward" + shape, 1, "block per row", fwd_bytes, fwd_flops, lab::Bound::Memory, reset_fwd, [&] {
        rmsnorm_forward_block_scalar<<<N, 256, 0, L.stream()>>>(d_out, d_rstd, d_inp, d_weight, N, C, EPS);
    }, check_fwd);
    if (C <= WARP_SIZE * REG_PACKS * x128::size)  // its register budget
    L.run("rmsnorm_forward" + shape, 2, "registers", fwd_bytes, fwd_flops, lab::Bound::Memory, reset_fwd, [&] {
        const int packs = ceil_div(C / x128::size, WARP_SIZE);
        auto kernel = packs <= 1   ? rmsnorm_forward_warp_registers<1>
                      : packs == 2 ? rmsnorm_forward_warp_registers<2>
                      : packs == 3 ? rmsnorm_forward_warp_registers<3>
                                   : rmsnorm_forward_warp_registers<REG_PACKS>;
        const int rows_per_block = RMSNORM_BLOCK / WARP_SIZE;
        kernel<<<ceil_div(N, rows_per_block), RMSNORM_BLOCK, 0, L.stream()>>>(d_out, d_rstd, d_inp, d_weight, N, C,
                                                                             EPS);
    }, check_fwd);

    // ---- fused residual + forward: the residual is rounded to floatX before it is normalized
    std::vector<float> ref_residual(NC), ref_fout(NC), ref_frstd(N);
    cpu::fused_residual_rmsnorm_forward(ref_residual.data(), ref_fout.data(), ref_frstd.data(), inp.data(),
                                        inp2.data(), weight.data(), 1, N, C, EPS);
    lab::round_to<floatX>(ref_residual);  // the GPU stores and normalizes the rounded sum
    cpu::rmsnorm_forward(ref_fout.data(), ref_frstd.data(), ref_residual.data(), weight.data(), 1, N, C, EPS);
    L.run("fused_residual_rmsnorm_forward" + shape, 0, "shipped", 4.0 * NC * s + 4.0 * N + C * s, 4.0 * NC,
          lab::Bound::Memory, [&] { reset_fwd(); d_residual.poison(L.stream()); },
          [&] {
              fused_residual_rmsnorm_forward(d_residual, d_out, d_rstd, d_inp, d_inp2, d_weight, N, C, EPS,
                                             L.stream());
          },
          [&] {
              bool ok = L.check(d_residual, ref_residual);
              ok = L.check(d_out, ref_fout) && ok;
              return L.check(d_rstd, ref_frstd, stat_tol) && ok;
          });

    // ---- backward (+=), with the reference's fp32 rstd as the saved statistics
    std::vector<float> ref_dinp = dinp0, ref_dweight = dweight0;
    cpu::rmsnorm_backward(ref_dinp.data(), ref_dweight.data(), dout.data(), inp.data(), weight.data(),
                          ref_rstd.data(), 1, N, C);
    lab::DevBuf<floatX> d_dout(NC, "dout"), d_dinp(NC, "dinp"), d_dweight(C, "dweight");
    lab::DevBuf<float> d_scratch(rmsnorm_backward_scratch_floats(N, C), "scratch");
    d_dout.upload(dout);
    d_rstd.upload(ref_rstd);
    const double bwd_bytes = 4.0 * NC * s + 4.0 * N + 3.0 * C * s, bwd_flops = 8.0 * NC;
    auto reset_bwd = [&] {
        d_dinp.upload(dinp0);
        d_dweight.upload(dweight0);
    };
    auto check_bwd = [&] {
        bool ok = L.check(d_dinp, ref_dinp);
        return L.check(d_dweight, ref_dweight) && ok;
    };
    auto launch_bwd0 = [&] {
        rmsnorm_backward(d_dinp, d_dweight, d_scratch, d_dout, d_inp, d_weight, d_rstd, N, C, L.ctx);
    };
    // variant 0 runs a second time from the same start: dinp and dweight must be bit-identical
    auto check_bwd_repeat = [&] {
        bool ok = check_bwd();
        const std::vector<float> dinp1 = d_dinp.download(), dweight1 = d_dweight.download();
        reset_bwd();
        launch_bwd0();
        cudaCheck(cudaStreamSynchronize(L.stream()));
        const std::vector<float> dinp2 = d_dinp.download(), dweight2 = d_dweight.download();
        const bool same = std::memcmp(dinp1.data(), dinp2.data(), dinp1.size() * sizeof(float)) == 0 &&
                          std::memcmp(dweight1.data(), dweight2.data(), dweight1.size() * sizeof(float)) == 0;
        printf("    %-10s %s\n", "repeat", same ? "ok: bit-identical to the first run" : "FAIL: not bit-identical");
        return same && ok;
    };
    L.run("rmsnorm_backward" + shape, 0, "shipped", bwd_bytes, bwd_flops, lab::Bound::Memory, reset_bwd, launch_bwd0,
          check_bwd_repeat);
    const bool narrow = C <= WARP_SIZE * NORM_BWD_REG_PACKS * x128::size;  // C <= 1024
    if (narrow)  // variant 1's 1024-column budget
    L.run("rmsnorm_backward" + shape, 1, "one pass", bwd_bytes, bwd_flops, lab::Bound::Memory, reset_bwd, [&] {
        const int chunks = column_num_chunks(N), rows_per_chunk = ceil_div(N, chunks);
        const int packs = ceil_div(C / x128::size, WARP_SIZE);
        auto kernel = packs <= 1   ? rmsnorm_backward_one_pass<1>
                      : packs == 2 ? rmsnorm_backward_one_pass<2>
                      : packs == 3 ? rmsnorm_backward_one_pass<3>
                                   : rmsnorm_backward_one_pass<REG_PACKS>;
        kernel<<<chunks, RMSNORM_BLOCK, 0, L.stream()>>>(d_dinp, d_scratch, d_dout, d_inp, d_weight, d_rstd, N, C,
                                                       rows_per_chunk);
        column_partials_add(d_dweight.get(), d_scratch.get(), chunks, (int64_t)C, C, L.stream());
    }, check_bwd);
    L.run("rmsnorm_backward" + shape, 2, "two kernels", bwd_bytes, bwd_flops, lab::Bound::Memory, reset_bwd, [&] {
        norm_backward_two_kernels<RMSNormBackward>(d_dinp, d_dweight, nullptr, d_scratch, N, C, L.stream(), d_dout, d_inp,
                                                   d_weight, d_rstd.get());
    }, check_bwd);
    // the shipped kernel with R = 1 and R = 2 rows per warp step at every narrow width (the launcher
    // picks R = 2 up to 2 packs per lane, i.e. C <= 512 in bf16, and R = 1 above; the wide kernels
    // take R = 1, variant 0)
    for (const int R : {1, 2}) {
        if (!narrow) break;
        L.run("rmsnorm_backward" + shape, 2 + R, R == 1 ? "fused R=1" : "fused R=2", bwd_bytes, bwd_flops,
              lab::Bound::Memory, reset_bwd, [&] {
                  norm_backward_dispatch(C, [&](auto packs) {
                      constexpr int P = decltype(packs)::value;
                      if constexpr (!norm_backward_wide<P>()) {
                          auto launch = [&](auto r) {
                              norm_backward_fused_launch<RMSNormBackward, P, decltype(r)::value>(
                                  d_dinp, d_dweight, nullptr, d_scratch, N, C, L.ctx, 0, d_dout, d_inp, d_weight,
                                  d_rstd.get());
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
        L.run("rmsnorm_backward" + shape, 5, "fused wide, 256 chunks", bwd_bytes, bwd_flops, lab::Bound::Memory,
              reset_bwd, [&] {
                  norm_backward_dispatch(C, [&](auto packs) {
                      constexpr int P = decltype(packs)::value;
                      norm_backward_fused_launch<RMSNormBackward, P, norm_backward_rows<P>()>(
                          d_dinp, d_dweight, nullptr, d_scratch, N, C, L.ctx,
                          std::min(NORM_BWD_MAX_CHUNKS, column_num_chunks(N)), d_dout, d_inp, d_weight, d_rstd.get());
                  });
              }, check_bwd);
}

// A decode step's M rows: the forward and the fused forward, the small-M kernel (0) against the
// large-M one (1), both checked against the CPU reference.
static void run_small(lab::Lab& L, int M, int C) {
    const std::string shape = " small M=" + std::to_string(M) + " C=" + std::to_string(C);
    const size_t NC = (size_t)M * C, s = sizeof(floatX);
    const uint64_t seed = 200 + 7 * (uint64_t)M + C;
    std::vector<float> inp = lab::rand_uniform(NC, seed, -2.0f, 2.0f), inp2 = lab::rand_uniform(NC, seed + 1);
    std::vector<float> weight = lab::rand_uniform(C, seed + 2, 0.5f, 1.5f);
    lab::DevBuf<floatX> d_inp(NC, "inp"), d_inp2(NC, "inp2"), d_weight(C, "weight");
    lab::DevBuf<floatX> d_out(NC, "out"), d_residual(NC, "residual");
    lab::DevBuf<float> d_rstd(M, "rstd");
    d_inp.upload(inp);
    d_inp2.upload(inp2);
    d_weight.upload(weight);
    const lab::Tol stat_tol = {1e-4, 1e-4};
    auto reset = [&] {
        d_out.poison(L.stream());
        d_residual.poison(L.stream());
        d_rstd.poison(L.stream());
    };
    std::vector<float> ref_out(NC), ref_rstd(M);
    cpu::rmsnorm_forward(ref_out.data(), ref_rstd.data(), inp.data(), weight.data(), 1, M, C, EPS);
    for (const int v : {0, 1})
        L.run("rmsnorm_forward" + shape, v, v == 0 ? "shipped small M: block per row" : "warp per row (large M)",
              2.0 * NC * s + 4.0 * M + C * s, 3.0 * NC, lab::Bound::Memory, reset, [&] {
                  rmsnorm_forward(d_out, d_rstd, d_inp, d_weight, M, C, EPS, L.stream(), NormLaunch{v == 0, false});
              }, [&] {
                  bool ok = L.check(d_out, ref_out);
                  return L.check(d_rstd, ref_rstd, stat_tol) && ok;
              });
    std::vector<float> ref_residual(NC), ref_fout(NC), ref_frstd(M);
    for (size_t i = 0; i < NC; i++) ref_residual[i] = inp[i] + inp2[i];
    lab::round_to<floatX>(ref_residual);  // the GPU stores and normalizes the rounded sum
    cpu::rmsnorm_forward(ref_fout.data(), ref_frstd.data(), ref_residual.data(), weight.data(), 1, M, C, EPS);
    for (const int v : {0, 1})
        L.run("fused_residual_rmsnorm_forward" + shape, v,
              v == 0 ? "shipped small M: block per row" : "warp per row (large M)", 4.0 * NC * s + 4.0 * M + C * s,
              4.0 * NC, lab::Bound::Memory, reset, [&] {
                  fused_residual_rmsnorm_forward(d_residual, d_out, d_rstd, d_inp, d_inp2, d_weight, M, C, EPS,
                                                 L.stream(), NormLaunch{v == 0, false});
              }, [&] {
                  bool ok = L.check(d_residual, ref_residual);
                  ok = L.check(d_out, ref_fout) && ok;
                  return L.check(d_rstd, ref_frstd, stat_tol) && ok;
              });
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "rmsnorm.cu");
    for (const int M : {1, 8, 64})
        for (const int C : {lab::GPT2_C, 776}) run_small(L, M, C);
    run_shape(L, lab::GPT2_B * lab::GPT2_T, lab::GPT2_C);
    run_shape(L, lab::ODD_B * lab::ODD_T, 776);
    run_shape(L, 16384, 1280);  // a Llama-style model of GPT-2 774M's width, B*T = 16 x 1024
    run_shape(L, 16384, 1600);  // 6.25 packs per lane in bf16
    return L.finish();
}
