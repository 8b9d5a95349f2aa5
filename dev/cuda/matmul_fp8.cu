// matmul_fp8.cu: the three FP8 matmuls of a linear layer (llmc/matmul_fp8.cuh, cuBLASLt) next to
// the bf16 cuBLASLt calls the trainer makes (llmc/matmul.cuh), at the GPT-2 124M shapes.
//   ./matmul_fp8 [variant ...] [--check-only] [--reps N]
// Layers at N = B*T = 65536: qkv 768->2304, attproj 768->768, fc 768->3072, fcproj 3072->768,
// lm_head 768->50304 (no bias), and a small one, N=704 C=832 OC=2368 (multiples of 64, not of 128).
// Each layer's three matmuls (row-major X (N, C), W (OC, C), dY (N, OC)):
//   fwd      Y  = X W^T + b     FP8: X (e4m3) . W (e4m3)                     bf16: matmul_forward
//   dinp     dX = dY W          FP8: dY (e5m2 or e4m3) . W^T copy (e4m3)    bf16: the trainer's dinp GEMM
//   dweight  dW += dY^T X       FP8: dY^T copy . X^T copy (e4m3), beta 1     bf16: the trainer's dweight GEMM
// The FP8 operands come from the shipped casts (llmc/fp8.cuh, checked bit for bit by fp8_cast.cu)
// at current scaling (amax pass, scale = fp8 max / amax), made once per layer, not timed with
// the matmuls; the layer's casts are timed as their own line (variant 5).
// Inputs: X, dY uniform in [-1, 1), W in [-0.05, 0.05), bias and dW's start in [-1, 1), rounded to
// bf16. Checks on 16 sampled rows of each output (first and last included; the written and guard
// checks cover every element):
//   FP8 against the exact product of the dequantized FP8 operands (decoded by llmc/cpu/fp8.h, summed
//   in double, times both scale_invs): what is left is fp32 accumulation order and the bf16 output
//   rounding, tolerance 2^-8 relative (the weight gradient 2^-7: it is added into a bf16 dW and
//   rounded to bf16 again, and its K = N sums leave Hopper's FP8 accumulator a few more bits of
//   error: the H200 measured ~100 of 1.7M elements between one half and one bf16 step off, nmse
//   5.5e-6) + 2e-3 rms and nmse below 1e-3 (a wrong layout or scale is
//   nmse ~1); with fast accumulation the narrower accumulator's error is the measurement, so only
//   a gross error fails it: 2^-8 + 1.0 rms, nmse below 0.1 (read its printed nmse).
//   bf16 against the CPU product of the bf16 operands at the lab's bf16 tolerance.
//   "vs bf16" (printed, not a check): FP8 against that bf16-operand product: the quantization error
//   a --fp8 trainer would add to each matmul.
// FLOPs 2*N*C*OC per matmul. Bytes: each operand once at its width (FP8 1, bf16 2), the output
// once (dweight read and written). % of GEMM is of the 710 TFLOP/s bf16 ceiling (the H200's dense
// FP8 peak is twice bf16's, so FP8 lines can pass 100%).
//
// Variants (per matmul):
//   0 FP8, the default recipe: fwd e4m3 x e4m3 with fast accumulation; dinp, dweight: dY in e5m2,
//     without fast accumulation
//   1 bf16 cuBLASLt, the trainer's call (the baseline of the FP8 / bf16 summary)
//   2 FP8 with the other accumulation mode (fwd without, dinp/dweight with fast accumulation)
//   3 FP8 dinp/dweight with dY in e4m3 (default accumulation)
//   4 FP8 dinp/dweight with dY in e4m3 and fast accumulation
//   5 the layer's FP8 casts with amax (X, W, dY: cast + transpose from one read each), memory-bound
//   6 FP8 rowwise (--fp8-scaling rowwise): cuBLASLt's outer-vector scales (one fp32 scale_inv per row
//     of each K-major operand: X, dY per token, W per output row; W^T, X^T, dY^T per channel), the
//     operands from the shipped fp8_cast_rowwise / fp8_cast_transpose_colwise; default accumulation
//     (fwd fast, gradients not), dY e5m2; checked like 0 with each row's scale_inv in the reference
//   7 the layer's rowwise casts: X, W, dY each by rows and by columns transposed (6 casts)
// After the table: per layer, bf16 ms / FP8 ms of each matmul and of the layer (3 matmuls; FP8 with
// and without its casts).
// Results (H200, 2026-12-03, 2622e99): stopped at the first FP8 matmul (fwd qkv, fast-accum, bias):
// cublasLtMatmul status 15, not supported: the A/B scale pointers were 4 bytes into Fp8Meta, and
// cuBLASLt wants them 16-byte aligned (a probe showed it); Fp8Meta is now aligned, not yet re-run.
// Variants 6 and 7 (outer-vector scales): not yet run on a GPU (dev/bench/fp8_rowwise.sh runs them).
#include <initializer_list>
#include "dev/cuda/harness.cuh"
#include "llmc/cpu/fp8.h"
#include "llmc/matmul.cuh"
#include "llmc/matmul_fp8.cuh"

typedef __nv_bfloat16 bf16;
constexpr int SAMPLES = 16;

struct Layer {
    const char* name;
    int N, C, OC;
    bool bias;
};


static std::vector<uint8_t> download_bytes(const lab::DevBuf<uint8_t>& b) {
    std::vector<uint8_t> h(b.size());
    cudaCheck(cudaMemcpy(h.data(), b.get(), b.size(), cudaMemcpyDeviceToHost));
    return h;
}
static std::vector<uint8_t> download_byte_rows(const lab::DevBuf<uint8_t>& b, const std::vector<int>& rows, size_t width) {
    std::vector<uint8_t> h(rows.size() * width);
    for (size_t i = 0; i < rows.size(); i++)
        cudaCheck(cudaMemcpy(&h[i * width], b.get() + (size_t)rows[i] * width, width, cudaMemcpyDeviceToHost));
    return h;
}

// ref (rows, M) = sp * sq * P (rows, K) . Q (M, K)^T of FP8 bytes, exact products summed in double;
// sp, sq one scale_inv (size 1) or one per row of P (rows) and of Q (M).
static std::vector<float> ref_fp8(const std::vector<uint8_t>& p, Fp8Format pf, const std::vector<float>& sp,
                                  const std::vector<uint8_t>& q, Fp8Format qf, const std::vector<float>& sq, int rows,
                                  int M, int K) {
    float tp[256], tq[256];
    for (int b = 0; b < 256; b++)
        tp[b] = cpu::fp8_decode((uint8_t)b, fp8_cpu_format(pf)), tq[b] = cpu::fp8_decode((uint8_t)b, fp8_cpu_format(qf));
    std::vector<float> out((size_t)rows * M);
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < rows; i++)
        for (int m = 0; m < M; m++) {
            const uint8_t* pr = &p[(size_t)i * K];
            const uint8_t* qr = &q[(size_t)m * K];
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += (double)tp[pr[k]] * tq[qr[k]];
            out[(size_t)i * M + m] = (float)(acc * sp[sp.size() == 1 ? 0 : i] * sq[sq.size() == 1 ? 0 : m]);
        }
    return out;
}
// ref (rows, M) = P (rows, K) . Q (M, K)^T in double
static std::vector<float> ref_dot(const std::vector<float>& p, const std::vector<float>& q, int rows, int M, int K) {
    std::vector<float> out((size_t)rows * M);
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < rows; i++)
        for (int m = 0; m < M; m++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += (double)p[(size_t)i * K + k] * q[(size_t)m * K + k];
            out[(size_t)i * M + m] = (float)acc;
        }
    return out;
}
// ref (rows, M) = P (rows, K) . QT (K, M) in double
static std::vector<float> ref_axpy(const std::vector<float>& p, const std::vector<float>& qt, int rows, int M, int K) {
    std::vector<float> out((size_t)rows * M);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        std::vector<double> acc(M, 0.0);
        for (int k = 0; k < K; k++) {
            const double a = p[(size_t)i * K + k];
            const float* q = &qt[(size_t)k * M];
            for (int m = 0; m < M; m++) acc[m] += a * q[m];
        }
        for (int m = 0; m < M; m++) out[(size_t)i * M + m] = (float)acc[m];
    }
    return out;
}
// adds add[m] (a row vector) or add[i][m] (per row) into ref
static void add_rows(std::vector<float>& ref, const std::vector<float>& add, int M) {
    const bool per_row = add.size() == ref.size();
    for (size_t i = 0; i < ref.size(); i++) ref[i] += add[per_row ? i : i % M];
}

// FP8 output: exact-operand check (elementwise + nmse bound) and the error against bf16 operands.
static bool check_fp8(lab::Lab& L, const lab::DevBuf<bf16>& d, const std::vector<float>& ref_exact,
                      const std::vector<float>& ref_bf16, const std::vector<int>& rows, int M, bool fast,
                      double rel = 1.0 / 256) {
    // fast accumulation: its error is what the line measures, so only a gross error fails it (a
    // wrong layout or scale, nmse ~1, shows in the accurate variants of the same call too)
    const lab::Tol tol = {rel, fast ? 1.0 : 2e-3};
    const double nmse_bound = fast ? 1e-1 : 1e-3;
    bool ok = L.check(d, ref_exact, tol, rows, M);
    const std::vector<float> got = d.download_rows(rows, M);
    const lab::Errors e = lab::measure(got, ref_exact, tol);
    if (!(e.nmse < nmse_bound)) {
        printf("    %-10s FAIL: nmse %.2e against the exact product (bound %.0e)\n", d.name(), e.nmse, nmse_bound);
        ok = false;
    }
    const lab::Errors q = lab::measure(got, ref_bf16, lab::Tol{0.0, 1e30});
    printf("    %-10s vs bf16 operands: max_abs %.2e  max_rel %.2e  nmse %.2e  (quantization, not a check)\n", "",
           q.max_abs, q.max_rel, q.nmse);
    return ok;
}

struct Times {  // ms per matmul: [fwd, dinp, dweight]; -1 where not run
    double bf16[3] = {-1, -1, -1}, fp8[3] = {-1, -1, -1}, casts = -1;
};

static Times run_layer(lab::Lab& L, const Layer& l) {
    const int N = l.N, C = l.C, OC = l.OC;
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    Times t;
    // ---- operands
    lab::DevBuf<floatX> d_x(nx, "x"), d_w(nw, "w"), d_dy(ny, "dy"), d_bias(OC, "bias");
    lab::DevBuf<bf16> d_bias8(OC, "bias8");
    d_x.fill_uniform(71);
    d_w.fill_uniform(72, -0.05f, 0.05f);
    d_dy.fill_uniform(73);
    std::vector<float> bias = lab::rand_uniform(OC, 74), dw0 = lab::rand_uniform(nw, 75);
    lab::round_to<bf16>(bias);
    lab::round_to<bf16>(dw0);
    d_bias.upload(bias);
    d_bias8.upload(bias);
    // FP8 copies: X, X^T, W, W^T (e4m3); dY, dY^T in e5m2 [0] and e4m3 [1]; current scaling
    lab::DevBuf<uint8_t> d_x8(nx, "x8"), d_xt8(nx, "xt8"), d_w8(nw, "w8"), d_wt8(nw, "wt8");
    lab::DevBuf<uint8_t> d_dy8_e5(ny, "dy8"), d_dyt8_e5(ny, "dyt8"), d_dy8_e4(ny, "dy8"), d_dyt8_e4(ny, "dyt8");
    lab::DevBuf<Fp8Meta> d_meta(4, "meta");  // X, W, dY e5m2, dY e4m3
    Fp8Meta* const mx = d_meta.get() + 0;
    Fp8Meta* const mw = d_meta.get() + 1;
    Fp8Meta* const mdy[2] = {d_meta.get() + 2, d_meta.get() + 3};
    const uint8_t* dy8[2] = {d_dy8_e5, d_dy8_e4};
    const uint8_t* dyt8[2] = {d_dyt8_e5, d_dyt8_e4};
    const Fp8Format gfmt[2] = {Fp8Format::E5M2, Fp8Format::E4M3};
    cudaStream_t s = L.stream();
    fp8_meta_init(mx, 2, Fp8Format::E4M3, s);
    fp8_meta_init(mdy[0], 1, Fp8Format::E5M2, s);
    fp8_meta_init(mdy[1], 1, Fp8Format::E4M3, s);
    fp8_amax(d_x, nx, mx, L.ctx);
    fp8_amax(d_w, nw, mw, L.ctx);
    fp8_amax(d_dy, ny, mdy[0], L.ctx);
    fp8_amax(d_dy, ny, mdy[1], L.ctx);
    fp8_update_scales(d_meta, 4, 1, 0, s);
    auto cast_all = [&](bool amax) {
        fp8_cast_transpose(d_xt8, d_x8, d_x, N, C, Fp8Format::E4M3, mx, amax, s);
        fp8_cast_transpose(d_wt8, d_w8, d_w, OC, C, Fp8Format::E4M3, mw, amax, s);
        fp8_cast_transpose(d_dyt8_e5, d_dy8_e5, d_dy, N, OC, Fp8Format::E5M2, mdy[0], amax, s);
    };
    cast_all(false);
    fp8_cast_transpose(d_dyt8_e4, d_dy8_e4, d_dy, N, OC, Fp8Format::E4M3, mdy[1], false, s);
    cudaCheck(cudaStreamSynchronize(s));
    std::vector<Fp8Meta> metas(4);
    cudaCheck(cudaMemcpy(metas.data(), d_meta.get(), 4 * sizeof(Fp8Meta), cudaMemcpyDeviceToHost));
    const float sx = metas[0].scale_inv, sw = metas[1].scale_inv, sdy[2] = {metas[2].scale_inv, metas[3].scale_inv};
    printf("  %s: scale_inv X %.4g, W %.4g, dY e5m2 %.4g, dY e4m3 %.4g\n", l.name, sx, sw, sdy[0], sdy[1]);

    // rowwise copies (variant 6): X, W, dY (e5m2) by rows; W^T, X^T, dY^T by columns, with their scale_invs
    const bool rw_ok = C <= FP8_ROWWISE_MAX_C && OC <= FP8_ROWWISE_MAX_C;  // lm_head's 50304 are too wide
    auto rw = [&](size_t n) { return rw_ok ? n : 1; };
    lab::DevBuf<uint8_t> r_x8(rw(nx), "x8_rows"), r_w8(rw(nw), "w8_rows"), r_dy8(rw(ny), "dy8_rows");
    lab::DevBuf<uint8_t> r_wt8(rw(nw), "wt8_cols"), r_xt8(rw(nx), "xt8_cols"), r_dyt8(rw(ny), "dyt8_cols");
    lab::DevBuf<float> r_sx(rw(N), "sx"), r_sw(rw(OC), "sw"), r_sdy(rw(N), "sdy"), r_swt(rw(C), "swt"),
        r_sxt(rw(C), "sxt"), r_sdyt(rw(OC), "sdyt"), r_scratch(rw(2 * (size_t)std::max(C, OC)), "scratch");
    auto cast_rowwise_all = [&] {
        fp8_cast_rowwise(r_x8, r_sx, d_x, N, C, Fp8Format::E4M3, s);
        fp8_cast_rowwise(r_w8, r_sw, d_w, OC, C, Fp8Format::E4M3, s);
        fp8_cast_rowwise(r_dy8, r_sdy, d_dy, N, OC, Fp8Format::E5M2, s);
        fp8_cast_transpose_colwise(r_wt8, r_swt, d_w, OC, C, Fp8Format::E4M3, r_scratch, s);
        fp8_cast_transpose_colwise(r_xt8, r_sxt, d_x, N, C, Fp8Format::E4M3, r_scratch, s);
        fp8_cast_transpose_colwise(r_dyt8, r_sdyt, d_dy, N, OC, Fp8Format::E5M2, r_scratch, s);
    };
    if (rw_ok) cast_rowwise_all();
    cudaCheck(cudaStreamSynchronize(s));
    auto gather = [](const std::vector<float>& v, const std::vector<int>& idx) {
        std::vector<float> g;
        for (int i : idx) g.push_back(v[i]);
        return g;
    };

    auto name = [&](const char* op) {
        return lab::Lab::strprintf("matmul_fp8 %s %s N=%d C=%d OC=%d", op, l.name, N, C, OC);
    };
    const double flops = 2.0 * N * C * OC;
    const double xb = sizeof(floatX);

    // ---- forward: Y (N, OC)
    {
        const std::vector<int> rows = lab::sample_rows(N, SAMPLES, 76);
        const int k = (int)rows.size();
        std::vector<float> ref8 = ref_fp8(download_byte_rows(d_x8, rows, C), Fp8Format::E4M3, {sx}, download_bytes(d_w8),
                                          Fp8Format::E4M3, {sw}, k, OC, C);
        std::vector<float> refb = ref_dot(d_x.download_rows(rows, C), d_w.download(), k, OC, C);
        if (l.bias) add_rows(ref8, bias, OC), add_rows(refb, bias, OC);
        lab::DevBuf<bf16> d_y8(ny, "y8");
        lab::DevBuf<floatX> d_y(ny, "y");
        const std::string op = name("fwd");
        const double b8 = nx + nw + 2.0 * ny, bb = (nx + nw + ny) * xb;
        for (int fast = 1; fast >= 0; fast--) {
            L.run(op, fast ? 0 : 2, fast ? "fp8 e4m3 fast-accum" : "fp8 e4m3 no fast-accum", b8, flops,
                  lab::Bound::Compute, [&] { d_y8.poison(s); },
                  [&] {
                      matmul_fp8_forward(d_y8, d_x8, &mx->scale_inv, d_w8, &mw->scale_inv,
                                         l.bias ? d_bias8.get() : nullptr, N, C, OC, Fp8Scales::TENSOR, L.ctx,
                                         fast == 1);
                  },
                  [&] { return check_fp8(L, d_y8, ref8, refb, rows, OC, fast); });
            if (!fast) continue;
            t.fp8[0] = L.last_ms();
            L.run(op, 1, "bf16 cuBLASLt", bb, flops, lab::Bound::Compute, [&] { d_y.poison(s); },
                  [&] { matmul_forward(d_y, nullptr, d_x, d_w, l.bias ? d_bias.get() : nullptr, N, C, OC, L.ctx); },
                  [&] { return L.check(d_y, refb, lab::default_tol(), rows, OC); });
            t.bf16[0] = L.last_ms();
        }
        if (rw_ok) {
            std::vector<float> ref_rw = ref_fp8(download_byte_rows(r_x8, rows, C), Fp8Format::E4M3,
                                                gather(r_sx.download(), rows), download_bytes(r_w8), Fp8Format::E4M3,
                                                r_sw.download(), k, OC, C);
            if (l.bias) add_rows(ref_rw, bias, OC);
            for (int fast = 1; fast >= 0; fast--)
                L.run(op, 6, fast ? "fp8 rowwise fast-accum" : "fp8 rowwise no fast-accum", b8 + 4.0 * (N + OC), flops,
                      lab::Bound::Compute, [&] { d_y8.poison(s); },
                      [&] {
                          matmul_fp8_forward(d_y8, r_x8, r_sx, r_w8, r_sw, l.bias ? d_bias8.get() : nullptr, N, C, OC,
                                             Fp8Scales::ROWS, L.ctx, fast == 1);
                      },
                      [&] { return check_fp8(L, d_y8, ref_rw, refb, rows, OC, fast); });
        }
    }
    // ---- input gradient: dX (N, C) = dY W
    {
        const std::vector<int> rows = lab::sample_rows(N, SAMPLES, 77);
        const int k = (int)rows.size();
        const std::vector<uint8_t> wt8 = download_bytes(d_wt8);
        std::vector<float> ref8[2];
        for (int g = 0; g < 2; g++) {
            const lab::DevBuf<uint8_t>& p = g == 0 ? d_dy8_e5 : d_dy8_e4;
            ref8[g] = ref_fp8(download_byte_rows(p, rows, OC), gfmt[g], {sdy[g]}, wt8, Fp8Format::E4M3, {sw}, k, C, OC);
        }
        const std::vector<float> refb = ref_axpy(d_dy.download_rows(rows, OC), d_w.download(), k, C, OC);
        lab::DevBuf<bf16> d_dx8(nx, "dx8");
        lab::DevBuf<floatX> d_dx(nx, "dx");
        const std::string op = name("dinp");
        const double b8 = ny + nw + 2.0 * nx, bb = (nx + nw + ny) * xb;
        struct V { int variant, g; bool fast; const char* what; };
        const V vs[] = {{0, 0, false, "fp8 dY e5m2"}, {2, 0, true, "fp8 dY e5m2 fast-accum"},
                        {3, 1, false, "fp8 dY e4m3"}, {4, 1, true, "fp8 dY e4m3 fast-accum"}};
        for (const V& v : vs) {
            L.run(op, v.variant, v.what, b8, flops, lab::Bound::Compute, [&] { d_dx8.poison(s); },
                  [&] {
                      // matmul_fp8_backward_input's product, with the fast-accum mode as a variant
                      matmul_fp8(d_dx8, dy8[v.g], gfmt[v.g], &mdy[v.g]->scale_inv, d_wt8, Fp8Format::E4M3,
                                 &mw->scale_inv, N, C, OC, nullptr, 0.0f, v.fast, Fp8Scales::TENSOR, L.ctx);
                  },
                  [&] { return check_fp8(L, d_dx8, ref8[v.g], refb, rows, C, v.fast); });
            if (v.variant != 0) continue;
            t.fp8[1] = L.last_ms();
            L.run(op, 1, "bf16 cuBLASLt", bb, flops, lab::Bound::Compute, [&] { d_dx.poison(s); },
                  [&] {
                      matmul_cublaslt(L.ctx, d_dx, d_w, d_dy, C, N, OC, false, false, C, OC, C, 0.0f,
                                      CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr);
                  },
                  [&] { return L.check(d_dx, refb, lab::default_tol(), rows, C); });
            t.bf16[1] = L.last_ms();
        }
        if (rw_ok) {
            const std::vector<float> ref_rw = ref_fp8(download_byte_rows(r_dy8, rows, OC), Fp8Format::E5M2,
                                                      gather(r_sdy.download(), rows), download_bytes(r_wt8),
                                                      Fp8Format::E4M3, r_swt.download(), k, C, OC);
            L.run(op, 6, "fp8 rowwise dY e5m2", b8 + 4.0 * (N + C), flops, lab::Bound::Compute, [&] { d_dx8.poison(s); },
                  [&] {
                      matmul_fp8_backward_input(d_dx8, r_dy8, Fp8Format::E5M2, r_sdy, r_wt8, r_swt, N, C, OC,
                                                Fp8Scales::ROWS, L.ctx);
                  },
                  [&] { return check_fp8(L, d_dx8, ref_rw, refb, rows, C, false); });
        }
    }
    // ---- weight gradient: dW (OC, C) += dY^T X
    {
        const std::vector<int> rows = lab::sample_rows(OC, SAMPLES, 78);
        const int k = (int)rows.size();
        const std::vector<float> dw0_rows = lab::gather_rows(dw0, rows, C);
        const std::vector<uint8_t> xt8 = download_bytes(d_xt8);
        std::vector<float> ref8[2];
        for (int g = 0; g < 2; g++) {
            const lab::DevBuf<uint8_t>& p = g == 0 ? d_dyt8_e5 : d_dyt8_e4;
            ref8[g] = ref_fp8(download_byte_rows(p, rows, N), gfmt[g], {sdy[g]}, xt8, Fp8Format::E4M3, {sx}, k, C, N);
            add_rows(ref8[g], dw0_rows, C);
        }
        // dY^T rows = dY columns
        const std::vector<float> dy_cols = d_dy.download_cols(rows, OC);  // (N, k)
        std::vector<float> dyt_rows((size_t)k * N);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < k; i++) dyt_rows[(size_t)i * N + n] = dy_cols[(size_t)n * k + i];
        std::vector<float> refb = ref_axpy(dyt_rows, d_x.download(), k, C, N);
        add_rows(refb, dw0_rows, C);
        lab::DevBuf<bf16> d_dw8(nw, "dw8");
        lab::DevBuf<floatX> d_dw(nw, "dw");
        const std::string op = name("dweight");
        const double b8 = (double)ny + nx + 4.0 * nw, bb = (nx + ny) * xb + 2.0 * nw * xb;
        struct V { int variant, g; bool fast; const char* what; };
        const V vs[] = {{0, 0, false, "fp8 dY e5m2"}, {2, 0, true, "fp8 dY e5m2 fast-accum"},
                        {3, 1, false, "fp8 dY e4m3"}, {4, 1, true, "fp8 dY e4m3 fast-accum"}};
        for (const V& v : vs) {
            L.run(op, v.variant, v.what, b8, flops, lab::Bound::Compute, [&] { d_dw8.upload(dw0); },
                  [&] {
                      // matmul_fp8_backward_weight's product, with the fast-accum mode as a variant
                      matmul_fp8(d_dw8, dyt8[v.g], gfmt[v.g], &mdy[v.g]->scale_inv, d_xt8, Fp8Format::E4M3,
                                 &mx->scale_inv, OC, C, N, nullptr, 1.0f, v.fast, Fp8Scales::TENSOR, L.ctx);
                  },
                  [&] { return check_fp8(L, d_dw8, ref8[v.g], refb, rows, C, v.fast, 1.0 / 128); });
            if (v.variant != 0) continue;
            t.fp8[2] = L.last_ms();
            L.run(op, 1, "bf16 cuBLASLt", bb, flops, lab::Bound::Compute, [&] { d_dw.upload(dw0); },
                  [&] {
                      matmul_cublaslt(L.ctx, d_dw, d_x, d_dy, C, OC, N, false, true, C, OC, C, 1.0f,
                                      CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr);
                  },
                  [&] { return L.check(d_dw, refb, lab::default_tol(), rows, C); });
            t.bf16[2] = L.last_ms();
        }
        if (rw_ok) {
            std::vector<float> ref_rw = ref_fp8(download_byte_rows(r_dyt8, rows, N), Fp8Format::E5M2,
                                                gather(r_sdyt.download(), rows), download_bytes(r_xt8), Fp8Format::E4M3,
                                                r_sxt.download(), k, C, N);
            add_rows(ref_rw, dw0_rows, C);
            L.run(op, 6, "fp8 rowwise dY e5m2", b8 + 4.0 * (OC + C), flops, lab::Bound::Compute,
                  [&] { d_dw8.upload(dw0); },
                  [&] {
                      matmul_fp8_backward_weight(d_dw8, r_dyt8, Fp8Format::E5M2, r_sdyt, r_xt8, r_sxt, N, C, OC,
                                                 Fp8Scales::ROWS, L.ctx);
                  },
                  [&] { return check_fp8(L, d_dw8, ref_rw, refb, rows, C, false, 1.0 / 128); });
        }
    }
    // the casts' check: every byte of each output written, its guard intact
    auto all_written = [&](std::initializer_list<const lab::DevBuf<uint8_t>*> bufs) {
        cudaCheck(cudaDeviceSynchronize());
        bool ok = true;
        for (const lab::DevBuf<uint8_t>* b : bufs) {
            const size_t unwritten = b->count_unwritten();
            if (unwritten || !b->guard_intact()) {
                printf("    %-10s FAIL: %zu bytes never written or the guard changed\n", b->name(), unwritten);
                ok = false;
            }
        }
        if (ok) printf("    casts      every byte written, guards intact  ok\n");
        return ok;
    };
    // ---- the layer's casts (delayed scaling's fused cast + amax): X, W, dY e5m2, each cast and
    // transposed from one read; checked for being written (their bytes are fp8_cast.cu's business)
    L.run(name("casts"), 5, "fp8 casts X, W, dY", (nx + nw + ny) * (xb + 2.0), (double)(nx + nw + ny),
          lab::Bound::Memory,
          [&] {
              d_x8.poison(s); d_xt8.poison(s); d_w8.poison(s); d_wt8.poison(s); d_dy8_e5.poison(s); d_dyt8_e5.poison(s);
          },
          [&] { cast_all(true); },
          [&] { return all_written({&d_x8, &d_xt8, &d_w8, &d_wt8, &d_dy8_e5, &d_dyt8_e5}); });
    t.casts = L.last_ms();
    if (rw_ok)
        L.run(name("casts"), 7, "fp8 rowwise casts X, W, dY by rows and columns", 2.0 * (nx + nw + ny) * (xb + 1.0),
              2.0 * (nx + nw + ny), lab::Bound::Memory,
              [&] {
                  for (lab::DevBuf<uint8_t>* b : {&r_x8, &r_w8, &r_dy8, &r_wt8, &r_xt8, &r_dyt8}) b->poison(s);
              },
              [&] { cast_rowwise_all(); },
              [&] { return all_written({&r_x8, &r_w8, &r_dy8, &r_wt8, &r_xt8, &r_dyt8}); });
    return t;
}

int main(int argc, char** argv) {
    lab::Lab L(argc, argv, "matmul_fp8.cu");
    const int N = lab::GPT2_B * lab::GPT2_T, C = lab::GPT2_C;
    const Layer layers[] = {
        {"qkv", N, C, 3 * C, true},     {"attproj", N, C, C, true},
        {"fc", N, C, 4 * C, true},      {"fcproj", N, 4 * C, C, true},
        {"lm_head", N, C, lab::GPT2_VP, false}, {"small", 704, 832, 2368, true},
    };
    std::vector<std::pair<const Layer*, Times>> times;
    for (const Layer& l : layers) times.push_back({&l, run_layer(L, l)});
    const int status = L.finish();
    if (!L.check_only()) {
        printf("\n# FP8 / bf16 (default FP8 recipe, variant 0 against 1): ms and speedup = bf16 ms / FP8 ms\n");
        printf("# layer | fwd | dinp | dweight | 3 matmuls | 3 matmuls + FP8 casts (X, W, dY)\n");
        for (auto& [l, t] : times) {
            std::string line = lab::Lab::strprintf("%s", l->name);
            double sb = 0, s8 = 0;
            bool all = true;
            for (int i = 0; i < 3; i++) {
                if (t.bf16[i] > 0 && t.fp8[i] > 0) {
                    line += lab::Lab::strprintf(" | %.3f / %.3f = %.2fx", t.bf16[i], t.fp8[i], t.bf16[i] / t.fp8[i]);
                    sb += t.bf16[i], s8 += t.fp8[i];
                } else {
                    line += " | -";
                    all = false;
                }
            }
            if (all) {
                line += lab::Lab::strprintf(" | %.3f / %.3f = %.2fx", sb, s8, sb / s8);
                if (t.casts > 0) line += lab::Lab::strprintf(" | %.3f / %.3f = %.2fx", sb, s8 + t.casts, sb / (s8 + t.casts));
                else line += " | -";
            } else {
                line += " | - | -";
            }
            printf("%s\n", line.c_str());
        }
    }
    return status;
}
