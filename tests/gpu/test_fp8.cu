// test_fp8.cu (build/test_fp8_gpu): the FP8 linear layers of --fp8 (llmc/model_fp8.cuh) against the CPU reference.
//   build/test_fp8_gpu        (make build/test_fp8_gpu; bf16 build; needs a GPU with FP8, sm_89+)
// A d2 GPT-2 (C 128, H 512, QKV 384) is built with --fp8 1 at N = B*T rows, and each linear layer
// of its first block (qkv 128->384, fc 128->512 with GELU, fcproj 512->128, and attproj 128->128)
// runs fp8_linear_forward then fp8_linear_backward, the trainer's calls, on fresh random bf16 X,
// W, bias, dY, and dW, dbias holding random values (they accumulate, +=); fc with its GELU, fcproj's
// input gradient through dGELU at a random pre-activation. dY in e5m2, then again in e4m3. Three
// recipes: per-tensor current scaling (FP8 weight gradient), rowwise scaling with the FP8 weight
// gradient, rowwise with the bf16 weight gradient (--fp8-wgrad bf16); and delayed scaling with the
// fused casts (llmc/fp8_fused.cuh): each layer run twice on the same inputs, the first pass (current
// scaling, as a run's first step) setting the scales the second (fused, checked) casts with, so the
// reference is the current one; the dY casts sum the bias gradient, and test_mlp runs fc -> GELU ->
// fcproj with the GELU and its derivative inside the casts.
// The reference (llmc/cpu/fp8.h): each operand's scale from its amax (cpu::fp8_scale_from_amax,
// current scaling; rowwise: cpu::fp8_row_scale of each row of the operand as the matmul reads it:
// X, dY per token row, W per output row for the forward and per input channel (column) for the
// input gradient, dY and X per column for the weight gradient), the operand cast to FP8 and decoded,
// the products summed in double, times the scale_invs; the bf16 weight gradient from the bf16
// operands; GELU and its derivative from llmc/cpu/gelu.h on the GPU's bf16 pre-activation.
// What remains is fp32 accumulation (fast accumulation in the forward), bf16 output rounding and the
// GELU kernel's: every element within 2^-7 |ref| + 2e-2 rms(ref), and nmse below 1e-3 (a wrong
// scale, layout or copy gives nmse ~1). The scales the GPU set must equal the CPU's bit for bit
// (rowwise: every scale_inv of every vector).
// Printed, not checked: the nmse of the FP8 output against the unquantized bf16 product (what FP8
// costs each matmul). Two row counts: 192 (a multiple of 64, not of 128) and 1024.
// Then the output head of --fp8-head 1 (test_head): forward, the classifier's FP8 dlogits (byte for
// byte against the CPU's cast), input and weight gradients.
// The batched weight casts of every block (test_cast_weights) against the per-layer ones. Then qkv's
// dY cast fed by the attention backward's fp32 dQ sums (test_dq_cast, fp8_cast_transpose_fused DQ_ACCUM): bit for bit against the
// dQ store + the plain cast it replaces and byte for byte against the CPU's cast; and the attention
// backward's keep_dq taking only where it may (test_dq_kept_only_where_allowed); and the trainer's
// backward with it against the same backward with the dQ store (test_dq_model).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include "llmc/model_train.cuh"
#include "llmc/cpu/fp8.h"
#include "llmc/cpu/gelu.h"
#include "llmc/rand.h"

static int failures = 0;


// Random bf16 values uniform in [-a, a), returned as the floats they are.
static std::vector<float> random_bf16(Rng& rng, size_t n, float a) {
    std::vector<float> v(n);
    for (float& x : v) x = bf16_to_float(float_to_bf16((2.0f * rng.uniform() - 1.0f) * a));
    return v;
}
static floatX* upload(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = float_to_bf16(v[i]);
    floatX* d = nullptr;
    cudaCheck(cudaMalloc(&d, b.size() * 2));
    cudaCheck(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    return d;
}
static floatX* poisoned(size_t n) {  // NaN everywhere: an element never written fails its check
    floatX* d = nullptr;
    cudaCheck(cudaMalloc(&d, n * 2));
    cudaCheck(cudaMemset(d, 0xFF, n * 2));
    return d;
}

// The dequantized operand the GPU's matmul reads, and its scales: x (R, C) cast to format f with one
// scale for the tensor (current scaling), one per row, or one per column.
enum class Grain { TENSOR, ROWS, COLS };
struct Quantized {
    std::vector<float> v;      // (R, C)
    std::vector<float> scale;  // (1), (R) or (C)
};
static Quantized quantize(const std::vector<float>& x, int R, int C, Fp8Format f, Grain g) {
    const cpu::Fp8Format cf = fp8_cpu_format(f);
    Quantized q;
    if (g == Grain::TENSOR) {
        float amax = 0.0f;
        for (float a : x) amax = std::max(amax, std::fabs(a));
        q.scale = {cpu::fp8_scale_from_amax(amax, cf, 0, 1.0f)};
    } else if (g == Grain::ROWS) {
        q.scale.resize(R);
        cpu::fp8_row_scales(q.scale.data(), x.data(), R, C, cf);
    } else {
        std::vector<float> xt((size_t)R * C);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) xt[(size_t)c * R + r] = x[(size_t)r * C + c];
        q.scale.resize(C);
        cpu::fp8_row_scales(q.scale.data(), xt.data(), C, R, cf);
    }
    q.v.resize(x.size());
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const float s = q.scale[g == Grain::TENSOR ? 0 : g == Grain::ROWS ? r : c];
            const size_t i = (size_t)r * C + c;
            q.v[i] = cpu::fp8_decode(cpu::fp8_cast(x[i], s, cf), cf) * (1.0f / s);
        }
    return q;
}

// A rowwise scale_inv vector the GPU wrote, against 1 / the CPU's scales, bit for bit.
static void check_scale_invs(const char* what, const float* d_sinv, const std::vector<float>& scale) {
    std::vector<float> got(scale.size());
    cudaCheck(cudaMemcpy(got.data(), d_sinv, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const float want = 1.0f / scale[i];
        if (memcmp(&got[i], &want, 4) != 0 && bad++ == 0) first = i;
    }
    printf("  scale_inv of %-22s %zu values  %s", what, got.size(), bad ? "FAIL" : "ok");
    if (bad) printf(" (%zu differ; first [%zu] got %.9g want %.9g)", bad, first, got[first], 1.0f / scale[first]);
    printf("\n");
    if (bad) failures++;
}

// got against ref: every element within 2^-7 |ref| + 2e-2 rms(ref), nmse below 1e-3.
static void check(const char* what, const std::vector<float>& got, const std::vector<float>& ref) {
    double se = 0.0, sr = 0.0;
    for (float r : ref) sr += (double)r * r;
    const double rms = std::sqrt(sr / ref.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = (double)got[i] - ref[i];
        se += d * d;
        if (!(std::fabs(d) <= std::ldexp(std::fabs(ref[i]), -7) + 2e-2 * rms)) {
            if (bad == 0) first = i;
            bad++;
        }
    }
    const double nmse = se / sr;
    const bool ok = bad == 0 && nmse < 1e-3;
    printf("  %-28s nmse %.2e  %s", what, nmse, ok ? "ok" : "FAIL");
    if (bad) printf(" (%zu of %zu elements out of tolerance; first [%zu] got %g want %g)", bad, ref.size(), first,
                    got[first], ref[first]);
    printf("\n");
    if (!ok) failures++;
}
static double nmse_of(const std::vector<float>& got, const std::vector<double>& ref) {
    double se = 0.0, sr = 0.0;
    for (size_t i = 0; i < ref.size(); i++) se += (got[i] - ref[i]) * (got[i] - ref[i]), sr += ref[i] * ref[i];
    return se / sr;
}

// One linear layer k of the model's first block, forward and backward, against the reference. gelu:
// the forward applies GELU (fc); dgelu: the backward's dinp goes through dGELU at a random
// pre-activation of the input's shape (fcproj, whose input is the GELU output).
static void test_linear(Model& model, int k, const char* name, bool gelu, bool dgelu, int N, Rng& rng,
                        const CudaContext& ctx) {
    ModelFp8& f = model.fp8;
    const int C = f.cin[k], OC = f.oc[k];
    const bool rowwise = f.set.scaling == Fp8Scaling::ROWWISE, wgrad_fp8 = !f.set.wgrad_bf16;
    const bool delayed = f.set.scaling == Fp8Scaling::DELAYED;
    printf("%s: N=%d, %d -> %d%s%s, dY %s, %s scaling, weight gradient %s\n", name, N, C, OC, gelu ? ", GELU" : "",
           dgelu ? ", dGELU" : "", fp8_format_name(f.set.grad),
           rowwise ? "rowwise" : delayed ? "delayed (second pass, fused dY + bias casts)" : "current",
           wgrad_fp8 ? "fp8" : "bf16");
    std::vector<float> x = random_bf16(rng, (size_t)N * C, 2.0f), w = random_bf16(rng, (size_t)OC * C, 0.1f);
    std::vector<float> bias = random_bf16(rng, OC, 0.5f), dy = random_bf16(rng, (size_t)N * OC, 1e-3f);
    std::vector<float> dw0 = random_bf16(rng, (size_t)OC * C, 1e-2f), db0 = random_bf16(rng, OC, 1e-2f);
    floatX *d_x = upload(x), *d_w = upload(w), *d_b = upload(bias), *d_dy = upload(dy), *d_dw = upload(dw0),
           *d_db = upload(db0);
    const std::vector<float> in_pre = dgelu ? random_bf16(rng, (size_t)N * C, 3.0f) : std::vector<float>();
    floatX *d_out = poisoned((size_t)N * OC), *d_pre = gelu ? poisoned((size_t)N * OC) : nullptr,
           *d_dx = poisoned((size_t)N * C), *d_in_pre = dgelu ? upload(in_pre) : nullptr;
    float* d_scratch = nullptr;
    cudaCheck(cudaMalloc(&d_scratch, sizeof(float) * column_num_chunks(N) * OC));
    if (delayed) {  // a first pass (current scaling: an empty history) sets the scales of these tensors;
        // the second, checked below, runs delayed scaling's fused casts with them
        f.warm = false;
        fp8_linear_forward(f, 0, k, d_out, d_pre, d_x, d_w, d_b, N, true, ctx);
        fp8_linear_backward(f, 0, k, d_dx, d_dw, d_db, d_scratch, d_dy, d_x, d_in_pre, N, ctx);
        fp8_after_backward(f, ctx.stream);
        if (!fp8_fused(f)) fail("test_fp8_gpu: the second pass is not the fused one");
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        for (floatX* d : {d_out, d_pre, d_dx}) if (d) cudaCheck(cudaMemset(d, 0xFF, 2 * (d == d_dx ? (size_t)N * C : (size_t)N * OC)));
        cudaCheck(cudaFree(d_dw));
        cudaCheck(cudaFree(d_db));
        d_dw = upload(dw0);
        d_db = upload(db0);
    }
    fp8_linear_forward(f, 0, k, d_out, d_pre, d_x, d_w, d_b, N, true, ctx);
    fp8_linear_backward(f, 0, k, d_dx, d_dw, d_db, d_scratch, d_dy, d_x, d_in_pre, N, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    const std::vector<float> out = device_to_float(d_out, (size_t)N * OC), dx = device_to_float(d_dx, (size_t)N * C);
    const std::vector<float> dw = device_to_float(d_dw, (size_t)OC * C), db = device_to_float(d_db, OC);
    const std::vector<float> pre = gelu ? device_to_float(d_pre, (size_t)N * OC) : std::vector<float>();

    // The operands each matmul reads (per-tensor: one quantization of each tensor serves all three).
    const Grain rows = rowwise ? Grain::ROWS : Grain::TENSOR, cols = rowwise ? Grain::COLS : Grain::TENSOR;
    const Fp8Format e4 = Fp8Format::E4M3;
    const Quantized xq = quantize(x, N, C, e4, rows), wq = quantize(w, OC, C, e4, rows);  // forward
    const Quantized dyq = quantize(dy, N, OC, f.set.grad, rows), wq_c = quantize(w, OC, C, e4, cols);  // input gradient
    const Quantized dyq_c = quantize(dy, N, OC, f.set.grad, cols), xq_c = quantize(x, N, C, e4, cols);  // weight gradient
    if (rowwise) {  // the GPU's scale_inv vectors against the CPU's scales
        const Fp8LinearBuffers b = fp8_linear_buffers(f, 0, k);
        check_scale_invs("X rows (forward)", f.rs_x, xq.scale);
        check_scale_invs("W rows (forward)", b.w_rows, wq.scale);
        check_scale_invs("dY rows (input grad)", f.rs_dy, dyq.scale);
        check_scale_invs("W columns (input grad)", b.wt_rows, wq_c.scale);
        if (wgrad_fp8) {
            check_scale_invs("dY columns (weight grad)", f.rs_dyt, dyq_c.scale);
            check_scale_invs("X columns (weight grad)", b.xt_rows, xq_c.scale);
        }
    } else {  // the GPU's Fp8Meta (scale after the update) against the CPU's from the same amax
        const Fp8Role roles[3] = {FP8_X, FP8_W, FP8_DY};
        const float want[3] = {xq.scale[0], wq.scale[0], dyq.scale[0]};
        for (int r = 0; r < 3; r++) {
            Fp8Meta m;
            cudaCheck(cudaMemcpy(&m, fp8_meta(f, roles[r], 0, k), sizeof(Fp8Meta), cudaMemcpyDeviceToHost));
            const bool ok = m.scale == want[r] && m.scale_inv == 1.0f / want[r];
            printf("  scale of %-3s %.6g (cpu %.6g) %s\n", r == 0 ? "X" : r == 1 ? "W" : "dY", m.scale, want[r],
                   ok ? "ok" : "FAIL");
            if (!ok) failures++;
        }
    }

    // forward: y = xq wq^T + b (double sums), then GELU on the GPU's pre-activation
    std::vector<float> y_ref((size_t)N * OC);
    std::vector<double> y_bf16((size_t)N * OC);  // the unquantized product, for the printed FP8 cost
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0, s16 = 0.0;
            for (int c = 0; c < C; c++) {
                s += (double)xq.v[(size_t)n * C + c] * wq.v[(size_t)o * C + c];
                s16 += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
            }
            y_ref[(size_t)n * OC + o] = (float)(s + bias[o]);
            y_bf16[(size_t)n * OC + o] = s16 + bias[o];
        }
    if (gelu) {
        check("forward pre-activation", pre, y_ref);
        std::vector<float> act_ref(pre.size());
        cpu::gelu_forward(act_ref.data(), pre.data(), pre.size());
        check("forward GELU output", out, act_ref);
    } else {
        check("forward", out, y_ref);
    }
    printf("  (FP8 vs unquantized product: nmse %.2e)\n", nmse_of(gelu ? pre : out, y_bf16));

    // input gradient: dyq wq_c (then dGELU at the input's pre-activation)
    std::vector<float> dx_ref((size_t)N * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) s += (double)dyq.v[(size_t)n * OC + o] * wq_c.v[(size_t)o * C + c];
            dx_ref[(size_t)n * C + c] = (float)s;
        }
    if (dgelu) {
        std::vector<float> d(dx_ref.size(), 0.0f);
        cpu::gelu_backward(d.data(), in_pre.data(), dx_ref.data(), d.size());
        dx_ref = d;
    }
    check(dgelu ? "input gradient (dGELU)" : "input gradient", dx, dx_ref);

    // weight gradient dw0 + dyq_c^T xq_c (bf16: dy^T x); bias gradient db0 + column sums of the bf16 dY
    const std::vector<float>& dy_w = wgrad_fp8 ? dyq_c.v : dy;
    const std::vector<float>& x_w = wgrad_fp8 ? xq_c.v : x;
    std::vector<float> dw_ref((size_t)OC * C), db_ref(OC);
    for (int o = 0; o < OC; o++) {
        double sb = 0.0;
        for (int n = 0; n < N; n++) sb += dy[(size_t)n * OC + o];
        db_ref[o] = (float)(db0[o] + sb);
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int n = 0; n < N; n++) s += (double)dy_w[(size_t)n * OC + o] * x_w[(size_t)n * C + c];
            dw_ref[(size_t)o * C + c] = (float)(dw0[(size_t)o * C + c] + s);
        }
    }
    check(wgrad_fp8 ? "weight gradient (+=)" : "weight gradient bf16 (+=)", dw, dw_ref);
    check("bias gradient (+=)", db, db_ref);
    for (floatX* p : {d_x, d_w, d_b, d_dy, d_dw, d_db, d_out, d_pre, d_dx, d_in_pre}) cudaCheck(cudaFree(p));
    cudaCheck(cudaFree(d_scratch));
}

// Delayed scaling with the fused casts across the MLP of block 0 (fp8_gelu_fused): fc's forward
// casts GELU(pre-activation) into fcproj's X and X^T, fcproj's backward leaves d(GELU output), fc's dY
// cast applies GELU' and sums fc's bias gradient. As test_linear's delayed recipe: a first pass
// (current scaling, separate GELU passes) sets the scales, the second runs fused and is checked.
// The reference takes the GPU's pre-activation and d(GELU output) (the matmuls before them are
// checked on their own), and the GELU output and d(pre-activation) the casts read from the unfused
// GPU kernels (gelu_forward, gelu_backward_inplace), each checked against llmc/cpu/gelu.h first.
// Why not the CPU's GELU: the GPU's tanhf is tanh.approx.f32 (--use_fast_math; ~2^-11 relative)
// and its products group differently, so some of its bf16 values sit one bf16 step from the CPU's;
// where such a pair straddles an FP8 rounding midpoint (~1 pair in 16 for e4m3, 32 for e5m2: the
// bf16 steps in one FP8 step) the cast operand moves a whole FP8 step (up to 12.5% or 25% of the
// element), and the matmul spreads that over a row of outputs: at N = 192 one fc input gradient
// element in 24,576 landed outside 2^-7 |ref| + 2% rms (twenty-second run), a small output beside
// one large flipped operand, which no tolerance on the outputs' scale can absorb. The unfused
// kernels run the same device functions with the same bf16 rounding as the fused casts
// (llmc/fp8_fused.cuh), so the reference's FP8 operands are the GPU's bit for bit, and so are the
// two GELU-derived scales (fcproj's X, fc's dY): the first pass took their amaxes from these same
// kernels' outputs of the same inputs. What is left is test_linear's: fp32 accumulation and the
// bf16 output rounding, inside the same tolerance.
static void test_mlp(Model& model, int N, Rng& rng, const CudaContext& ctx) {
    ModelFp8& f = model.fp8;
    const int C = f.cin[FP8_FC], H = f.oc[FP8_FC];
    printf("mlp: N=%d, %d -> %d -> GELU -> %d, dY %s, delayed scaling, fused GELU casts\n", N, C, H, C,
           fp8_format_name(f.set.grad));
    const std::vector<float> x = random_bf16(rng, (size_t)N * C, 2.0f), w1 = random_bf16(rng, (size_t)H * C, 0.1f);
    const std::vector<float> b1 = random_bf16(rng, H, 0.5f), w2 = random_bf16(rng, (size_t)C * H, 0.1f);
    const std::vector<float> b2 = random_bf16(rng, C, 0.5f), dy = random_bf16(rng, (size_t)N * C, 1e-3f);
    const std::vector<float> dw1_0 = random_bf16(rng, (size_t)H * C, 1e-2f), db1_0 = random_bf16(rng, H, 1e-2f);
    const std::vector<float> dw2_0 = random_bf16(rng, (size_t)C * H, 1e-2f), db2_0 = random_bf16(rng, C, 1e-2f);
    floatX *d_x = upload(x), *d_w1 = upload(w1), *d_b1 = upload(b1), *d_w2 = upload(w2), *d_b2 = upload(b2), *d_dy = upload(dy);
    floatX *d_dw1 = nullptr, *d_db1 = nullptr, *d_dw2 = nullptr, *d_db2 = nullptr;
    floatX *d_pre = poisoned((size_t)N * H), *d_act = poisoned((size_t)N * H), *d_y = poisoned((size_t)N * C);
    floatX *d_dact = poisoned((size_t)N * H), *d_dx = poisoned((size_t)N * C);
    float* d_scratch = nullptr;
    cudaCheck(cudaMalloc(&d_scratch, sizeof(float) * column_num_chunks(N) * H));
    for (int pass = 0; pass < 2; pass++) {
        for (floatX* d : {d_dw1, d_db1, d_dw2, d_db2}) cudaCheck(cudaFree(d));
        d_dw1 = upload(dw1_0), d_db1 = upload(db1_0), d_dw2 = upload(dw2_0), d_db2 = upload(db2_0);
        for (floatX* d : {d_pre, d_act, d_dact}) cudaCheck(cudaMemset(d, 0xFF, (size_t)N * H * 2));
        for (floatX* d : {d_y, d_dx}) cudaCheck(cudaMemset(d, 0xFF, (size_t)N * C * 2));
        if (pass == 0) f.warm = false;
        else if (!fp8_gelu_fused(f, 0)) fail("test_fp8_gpu: the second pass does not fuse the GELU");
        const bool fused = pass == 1;
        fp8_linear_forward(f, 0, FP8_FC, d_act, d_pre, d_x, d_w1, d_b1, N, true, ctx);
        fp8_linear_forward(f, 0, FP8_FCPROJ, d_y, nullptr, d_act, d_w2, d_b2, N, true, ctx);
        fp8_linear_backward(f, 0, FP8_FCPROJ, d_dact, d_dw2, d_db2, d_scratch, d_dy, d_act, d_pre, N, ctx);
        fp8_linear_backward(f, 0, FP8_FC, d_dx, d_dw1, d_db1, d_scratch, d_dact, d_x, nullptr, N, ctx,
                            fused ? d_pre : nullptr);
        if (pass == 0) fp8_after_backward(f, ctx.stream);  // warm; the scales stay those of pass 0
        cudaCheck(cudaStreamSynchronize(ctx.stream));
    }
    const std::vector<float> pre = device_to_float(d_pre, (size_t)N * H), y = device_to_float(d_y, (size_t)N * C);
    const std::vector<float> dact = device_to_float(d_dact, (size_t)N * H), dx = device_to_float(d_dx, (size_t)N * C);
    const std::vector<float> dw1 = device_to_float(d_dw1, (size_t)H * C), db1 = device_to_float(d_db1, H);
    const std::vector<float> dw2 = device_to_float(d_dw2, (size_t)C * H), db2 = device_to_float(d_db2, C);

    const Fp8Format e4 = Fp8Format::E4M3;
    const Quantized xq = quantize(x, N, C, e4, Grain::TENSOR), w1q = quantize(w1, H, C, e4, Grain::TENSOR);
    const Quantized w2q = quantize(w2, C, H, e4, Grain::TENSOR), dyq = quantize(dy, N, C, f.set.grad, Grain::TENSOR);
    // the bf16 GELU output and d(pre-activation) the casts read (see above), against the CPU's GELU
    floatX* d_gelu = poisoned((size_t)N * H);
    gelu_forward(d_gelu, d_pre, (int64_t)N * H, ctx.stream);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    const std::vector<float> act = device_to_float(d_gelu, (size_t)N * H);
    cudaCheck(cudaMemcpy(d_gelu, d_dact, (size_t)N * H * sizeof(floatX), cudaMemcpyDeviceToDevice));
    gelu_backward_inplace(d_gelu, d_pre, (int64_t)N * H, ctx.stream);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    const std::vector<float> dpre = device_to_float(d_gelu, (size_t)N * H);
    cudaCheck(cudaFree(d_gelu));
    std::vector<float> act_cpu((size_t)N * H), dpre_cpu((size_t)N * H, 0.0f);
    cpu::gelu_forward(act_cpu.data(), pre.data(), act_cpu.size());
    cpu::gelu_backward(dpre_cpu.data(), pre.data(), dact.data(), dpre_cpu.size());
    check("GELU output (gelu_forward)", act, act_cpu);
    check("dGELU (gelu_backward)", dpre, dpre_cpu);
    const Quantized actq = quantize(act, N, H, e4, Grain::TENSOR), dpreq = quantize(dpre, N, H, f.set.grad, Grain::TENSOR);
    // the scales the fused casts used (set by the first pass) against the CPU's, bit for bit
    const struct { Fp8Role role; int k; float want; const char* what; } scales[2] = {
        {FP8_X, FP8_FCPROJ, actq.scale[0], "fcproj X (GELU output)"}, {FP8_DY, FP8_FC, dpreq.scale[0], "fc dY (dGELU)"}};
    for (const auto& sc : scales) {
        Fp8Meta m;
        cudaCheck(cudaMemcpy(&m, fp8_meta(f, sc.role, 0, sc.k), sizeof(Fp8Meta), cudaMemcpyDeviceToHost));
        const bool ok = m.scale == sc.want && m.scale_inv == 1.0f / sc.want;
        printf("  scale of %-22s %.6g (cpu %.6g) %s\n", sc.what, m.scale, sc.want, ok ? "ok" : "FAIL");
        if (!ok) failures++;
    }
    // products in double: D (R, M) = P (R, K) Q (M, K)^T, plus bias (M) and start (R, M) when given
    auto product = [](const std::vector<float>& p, const std::vector<float>& q, int R, int M, int K,
                      const std::vector<float>* bias, const std::vector<float>* start) {
        std::vector<float> d((size_t)R * M);
        for (int r = 0; r < R; r++)
            for (int m = 0; m < M; m++) {
                double s = 0.0;
                for (int k = 0; k < K; k++) s += (double)p[(size_t)r * K + k] * q[(size_t)m * K + k];
                d[(size_t)r * M + m] = (float)(s + (bias ? (*bias)[m] : 0.0) + (start ? (*start)[(size_t)r * M + m] : 0.0));
            }
        return d;
    };
    auto transpose = [](const std::vector<float>& a, int R, int C) {
        std::vector<float> t(a.size());
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) t[(size_t)c * R + r] = a[(size_t)r * C + c];
        return t;
    };
    auto colsum = [](const std::vector<float>& a, int R, int C, const std::vector<float>& start) {
        std::vector<float> s(C);
        for (int c = 0; c < C; c++) {
            double t = start[c];
            for (int r = 0; r < R; r++) t += a[(size_t)r * C + c];
            s[c] = (float)t;
        }
        return s;
    };
    check("fc pre-activation", pre, product(xq.v, w1q.v, N, H, C, &b1, nullptr));
    check("fcproj forward (GELU cast)", y, product(actq.v, w2q.v, N, C, H, &b2, nullptr));
    check("fcproj input gradient", dact, product(dyq.v, transpose(w2q.v, C, H), N, H, C, nullptr, nullptr));
    check("fcproj weight gradient", dw2, product(transpose(dyq.v, N, C), transpose(actq.v, N, H), C, H, N, nullptr, &dw2_0));
    check("fcproj bias gradient", db2, colsum(dy, N, C, db2_0));
    check("fc input gradient (dGELU cast)", dx, product(dpreq.v, transpose(w1q.v, H, C), N, C, H, nullptr, nullptr));
    check("fc weight gradient", dw1, product(transpose(dpreq.v, N, H), transpose(xq.v, N, C), H, C, N, nullptr, &dw1_0));
    check("fc bias gradient (in the cast)", db1, colsum(dpre, N, H, db1_0));
    for (floatX* p : {d_x, d_w1, d_b1, d_w2, d_b2, d_dy, d_dw1, d_db1, d_dw2, d_db2, d_pre, d_act, d_y, d_dact, d_dx})
        cudaCheck(cudaFree(p));
    cudaCheck(cudaFree(d_scratch));
}

// The output head in FP8 (--fp8-head 1; llmc/model_fp8.cuh, fp8_head_*), on a model with a vocabulary of
// V (padded to Vp) at N rows: fp8_head_forward's logits, the classifier's FP8 dlogits and
// fp8_head_backward's input and weight gradients, on fresh random X (lnf's output), W and targets.
//   forward         logits against xq . wq^T in double (X and W quantized with the scales the GPU set,
//                   checked bit for bit)
//   classifier      the same logits through fused_classifier (bf16 dlogits) and fused_classifier_fp8 (FP8
//                   in place): the losses bit for bit equal; the scale exactly cpu::fp8_pow2_scale(dloss);
//                   every FP8 byte (padded columns included) equal to cpu::fp8_cast of the bf16 dlogits
//                   at that scale; the bf16 dlogits and the losses against a softmax in double
//   input grad      dX (N, C) against dq . wq, dq = the GPU's FP8 dlogits decoded (poisoned dX)
//   weight grad     dW (Vp, C) += dq^T . xq, from random dW (the chunked transposes inside the logits)
// N below Vp takes the vocabulary-chunk path of the weight gradient, N above it the token-range one.
static void test_head(const CudaContext& ctx, Rng& rng, Fp8Format grad, int B, int V, int Vp) {
    ModelConfig config = model_config_from_descriptor("d2");
    config.vocab_size = V;
    config.padded_vocab_size = Vp;
    Model model;
    model.fp8.set.enabled = true;
    model.fp8.set.head = true;
    model.fp8.set.grad = grad;
    model_build(model, config, B, 64, false, ctx);
    ModelFp8& f = model.fp8;
    const int N = B * 64, C = f.C;
    const cpu::Fp8Format cf = fp8_cpu_format(grad);
    const float dloss = 1.0f / (3.0f * N);  // not a power of two: the scale rounds down to one
    printf("head: N=%d, C %d -> V %d (padded %d), dlogits %s, dloss 1/(3N)\n", N, C, V, Vp, fp8_format_name(grad));
    const std::vector<float> x = random_bf16(rng, (size_t)N * C, 2.0f), w = random_bf16(rng, (size_t)Vp * C, 0.5f);
    const std::vector<float> dw0 = random_bf16(rng, (size_t)Vp * C, 1e-4f);
    std::vector<int> targets(N);
    for (int& t : targets) t = (int)rng.below(V);
    floatX *d_x = upload(x), *d_w = upload(w), *d_dw = upload(dw0);
    floatX *d_logits = poisoned((size_t)N * Vp), *d_ref = poisoned((size_t)N * Vp), *d_dx = poisoned((size_t)N * C);
    int* d_targets = nullptr;
    float *d_losses = nullptr, *d_losses_ref = nullptr;
    cudaCheck(cudaMalloc(&d_targets, N * sizeof(int)));
    cudaCheck(cudaMemcpy(d_targets, targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&d_losses, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d_losses_ref, N * sizeof(float)));

    fp8_head_forward(f, d_logits, d_x, d_w, N, true, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    const std::vector<float> logits = device_to_float(d_logits, (size_t)N * Vp);
    cudaCheck(cudaMemcpy(d_ref, d_logits, (size_t)N * Vp * sizeof(floatX), cudaMemcpyDeviceToDevice));
    fused_classifier(d_ref, d_losses_ref, d_targets, dloss, N, V, Vp, true, ctx.stream);
    fp8_head_classifier(f, d_logits, d_losses, d_targets, dloss, N, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    std::vector<uint8_t> d8((size_t)N * Vp * sizeof(floatX));
    cudaCheck(cudaMemcpy(d8.data(), d_logits, d8.size(), cudaMemcpyDeviceToHost));
    const std::vector<float> dref = device_to_float(d_ref, (size_t)N * Vp);
    std::vector<float> losses(N), losses_ref(N);
    cudaCheck(cudaMemcpy(losses.data(), d_losses, N * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(losses_ref.data(), d_losses_ref, N * sizeof(float), cudaMemcpyDeviceToHost));
    fp8_head_backward(f, d_dx, d_dw, d_logits, N, ctx);
    cudaCheck(cudaStreamSynchronize(ctx.stream));
    const std::vector<float> dx = device_to_float(d_dx, (size_t)N * C), dw = device_to_float(d_dw, (size_t)Vp * C);

    // scales: X and W from their amaxes (current), dlogits the power of two under fp8 max / dloss
    const Quantized xq = quantize(x, N, C, Fp8Format::E4M3, Grain::TENSOR), wq = quantize(w, Vp, C, Fp8Format::E4M3, Grain::TENSOR);
    const float dscale = cpu::fp8_pow2_scale(dloss, cf);
    const struct { Fp8Role role; float want; const char* what; } scales[3] = {
        {FP8_X, xq.scale[0], "X"}, {FP8_W, wq.scale[0], "W"}, {FP8_DY, dscale, "dlogits"}};
    for (const auto& sc : scales) {
        Fp8Meta m;
        cudaCheck(cudaMemcpy(&m, f.head_metas + sc.role, sizeof(Fp8Meta), cudaMemcpyDeviceToHost));
        const bool ok = m.scale == sc.want && m.scale_inv == 1.0f / sc.want;
        printf("  scale of %-8s %.6g (cpu %.6g) %s\n", sc.what, m.scale, sc.want, ok ? "ok" : "FAIL");
        if (!ok) failures++;
    }
    if (!(dloss * dscale <= cpu::fp8_max(cf) && 2.0f * dloss * dscale > cpu::fp8_max(cf))) {
        printf("  dlogits scale %g: dloss * scale = %g is not in (max / 2, max]  FAIL\n", dscale, dloss * dscale);
        failures++;
    }

    // forward
    std::vector<float> y_ref((size_t)N * Vp);
    std::vector<double> y_bf16((size_t)N * Vp);
    for (int n = 0; n < N; n++)
        for (int v = 0; v < Vp; v++) {
            double s = 0.0, s16 = 0.0;
            for (int c = 0; c < C; c++) {
                s += (double)xq.v[(size_t)n * C + c] * wq.v[(size_t)v * C + c];
                s16 += (double)x[(size_t)n * C + c] * w[(size_t)v * C + c];
            }
            y_ref[(size_t)n * Vp + v] = (float)s;
            y_bf16[(size_t)n * Vp + v] = s16;
        }
    check("head forward (logits)", logits, y_ref);
    printf("  (FP8 vs unquantized product: nmse %.2e)\n", nmse_of(logits, y_bf16));

    // classifier: the bf16 path against double, then the FP8 bytes against the CPU cast of its values
    std::vector<float> dlog_ref((size_t)N * Vp, 0.0f), loss_ref(N);
    for (int n = 0; n < N; n++) {
        const float* l = &logits[(size_t)n * Vp];
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) mx = std::max(mx, (double)l[v]);
        for (int v = 0; v < V; v++) sum += std::exp(l[v] - mx);
        loss_ref[n] = (float)(std::log(sum) + mx - l[targets[n]]);
        for (int v = 0; v < V; v++)
            dlog_ref[(size_t)n * Vp + v] = (float)(dloss * (std::exp(l[v] - mx) / sum - (v == targets[n] ? 1.0 : 0.0)));
    }
    check("classifier losses", losses_ref, loss_ref);
    check("classifier bf16 dlogits", dref, dlog_ref);
    size_t loss_diff = 0, byte_diff = 0, first = 0;
    for (int n = 0; n < N; n++) loss_diff += memcmp(&losses[n], &losses_ref[n], 4) != 0;
    std::vector<float> dq((size_t)N * Vp);  // the FP8 dlogits as the matmuls read them
    for (int n = 0; n < N; n++)
        for (int v = 0; v < Vp; v++) {
            const size_t i = (size_t)n * Vp + v;
            const uint8_t got = d8[(size_t)n * Vp * sizeof(floatX) + v], want = cpu::fp8_cast(dref[i], dscale, cf);
            if (got != want && byte_diff++ == 0) first = i;
            dq[i] = cpu::fp8_decode(got, cf) / dscale;
        }
    printf("  FP8 classifier: losses %s (%zu differ from the bf16 classifier's), dlogits bytes %s", loss_diff ? "FAIL" : "ok",
           loss_diff, byte_diff ? "FAIL" : "ok");
    if (byte_diff)
        printf(" (%zu of %zu differ; first [%zu] got 0x%02x want 0x%02x from %g)", byte_diff, dq.size(), first,
               d8[(first / Vp) * Vp * sizeof(floatX) + first % Vp], cpu::fp8_cast(dref[first], dscale, cf), dref[first]);
    printf("\n");
    if (loss_diff || byte_diff) failures++;

    // input gradient dq . wq; weight gradient dw0 + dq^T . xq
    std::vector<float> dx_ref((size_t)N * C), dw_ref((size_t)Vp * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int v = 0; v < Vp; v++) s += (double)dq[(size_t)n * Vp + v] * wq.v[(size_t)v * C + c];
            dx_ref[(size_t)n * C + c] = (float)s;
        }
    for (int v = 0; v < Vp; v++)
        for (int c = 0; c < C; c++) {
            double s = dw0[(size_t)v * C + c];
            for (int n = 0; n < N; n++) s += (double)dq[(size_t)n * Vp + v] * xq.v[(size_t)n * C + c];
            dw_ref[(size_t)v * C + c] = (float)s;
        }
    check("head input gradient", dx, dx_ref);
    check("head weight gradient (+=)", dw, dw_ref);
    for (floatX* p : {d_x, d_w, d_dw, d_logits, d_ref, d_dx}) cudaCheck(cudaFree(p));
    cudaCheck(cudaFree(d_targets));
    cudaCheck(cudaFree(d_losses));
    cudaCheck(cudaFree(d_losses_ref));
    model_free(model);
}

// fp8_cast_weights (every block's weight copies in 9 launches, model_forward's path outside ZeRO) against
// the per-layer casts fp8_linear_forward makes (cast_scaled, current scaling): the same W and W^T bytes
// and the same scales, bit for bit, each run into a poisoned copy buffer from fresh metas; with
// --fp8-bf16-layers 1 the end blocks' copies stay untouched.
static void test_cast_weights(const CudaContext& ctx, Rng& rng, int bf16_layers) {
    Model model;
    model.fp8.set.enabled = true;
    model.fp8.set.scaling = Fp8Scaling::CURRENT;
    model.fp8.set.bf16_layers = bf16_layers;
    model_build(model, model_config_from_descriptor("d4"), 2, 64, false, ctx);
    ModelFp8& f = model.fp8;
    floatX* w[FP8_LINEARS] = {model.params.qkvw, model.params.attprojw, model.params.fcw, model.params.fcprojw};
    for (int k = 0; k < FP8_LINEARS; k++) {  // fresh weights, a different range per linear
        const std::vector<float> v = random_bf16(rng, (size_t)f.L * f.oc[k] * f.cin[k], 0.02f * (k + 1));
        std::vector<uint16_t> b(v.size());
        for (size_t i = 0; i < v.size(); i++) b[i] = float_to_bf16(v[i]);
        cudaCheck(cudaMemcpy(w[k], b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    }
    const size_t bytes = (size_t)f.L * f.w_layer_bytes;
    const int metas = f.L * FP8_LINEARS;
    auto run = [&](bool batched, std::vector<uint8_t>& copies, std::vector<Fp8Meta>& m) {
        cudaCheck(cudaMemset(f.weights, 0xFF, bytes));
        fp8_meta_init(fp8_meta(f, FP8_W, 0, 0), metas, Fp8Format::E4M3, ctx.stream);
        if (batched) {
            const floatX* const cw[FP8_LINEARS] = {w[0], w[1], w[2], w[3]};
            fp8_cast_weights(f, cw, ctx);
        } else {
            for (int l = f.set.bf16_layers; l < f.L - f.set.bf16_layers; l++)
                for (int k = 0; k < FP8_LINEARS; k++) {
                    const Fp8LinearBuffers b = fp8_linear_buffers(f, l, k);
                    fp8_cast_scaled(f, b.wt8, b.w8, w[k] + (size_t)l * f.oc[k] * f.cin[k], f.oc[k], f.cin[k],
                                    Fp8Format::E4M3, fp8_meta(f, FP8_W, l, k), true, 1, nullptr, nullptr, ctx);
                }
        }
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        copies.resize(bytes);
        m.resize(metas);
        cudaCheck(cudaMemcpy(copies.data(), f.weights, bytes, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(m.data(), fp8_meta(f, FP8_W, 0, 0), metas * sizeof(Fp8Meta), cudaMemcpyDeviceToHost));
    };
    std::vector<uint8_t> one, all;
    std::vector<Fp8Meta> m_one, m_all;
    run(false, one, m_one);
    run(true, all, m_all);
    size_t differ = 0, untouched = 0;
    for (size_t i = 0; i < bytes; i++) differ += one[i] != all[i], untouched += all[i] == 0xFF;
    int scale_differ = 0;
    for (int i = 0; i < metas; i++)
        scale_differ += memcmp(&m_one[i].scale, &m_all[i].scale, 4) != 0 || memcmp(&m_one[i].scale_inv, &m_all[i].scale_inv, 4) != 0;
    // the end blocks' copies (bf16_layers) must stay poisoned: 2 * bf16_layers blocks of w_layer_bytes
    const size_t end_bytes = 2 * (size_t)bf16_layers * f.w_layer_bytes;
    size_t end_written = 0;
    for (size_t i = 0; i < end_bytes; i++) {
        const size_t at = i < end_bytes / 2 ? i : bytes - end_bytes + i;
        end_written += all[at] != 0xFF;
    }
    // a cast never writes 0xFF (e4m3 NaN; the casts saturate): every other byte was written
    const bool ok = differ == 0 && scale_differ == 0 && end_written == 0 && untouched == end_bytes;
    printf("%-4s batched weight casts (d4, --fp8-bf16-layers %d): %zu of %zu bytes differ from the per-layer casts, "
           "%d scales differ, %zu end-block bytes written\n", ok ? "ok" : "FAIL", bf16_layers, differ, bytes, scale_differ,
           end_written);
    if (!ok) failures++;
    model_free(model);
}

// qkv's dY cast with its dQ columns read from the attention backward's fp32 sums (fp8_dq_fused;
// fp8_cast_transpose_fused DQ_ACCUM), at B, T, NH query and NKV key/value heads of HD (qkv's dY: N =
// B*T rows of (NH + 2 NKV) HD columns, the first NH HD dQ's), dY in `grad`, with or without the bias
// gradient:
//   the attention backward (random qkv, the forward's out and lse, random dO) with keep_dq into a
//   poisoned dqkv must return its scratch and leave every dQ column poisoned, dK and dV bit for bit
//   those of a plain backward (deterministic: summed in registers);
//   the DQ_ACCUM cast (poisoned outputs; dbias += onto random values) against attention_dq_store on
//   the same sums then the NONE cast (the path it replaces): every byte of dY and dY^T, the amax and
//   the bias gradient bit for bit, no byte left poisoned;
//   the stored dQ against the plain backward's (its own fp32 atomics: within bf16 tolerance) and the
//   sums themselves (dq_from_accum's scale 1/sqrt(HD), at 1 bf16 step), so the sums' layout is the
//   one dqkv's dQ columns have; every byte of the DQ_ACCUM cast against cpu::fp8_cast of the stored
//   dqkv, the amax against its max |x|, the bias gradient against a double sum.
// The scale: current scaling's from 0.9 x the amax (delayed scaling: some values saturate).
static void test_dq_cast(const CudaContext& ctx, Rng& rng, Fp8Format grad, int B, int T, int NH, int NKV, int HD,
                         bool with_bias) {
    const int N = B * T, Q = NH * HD, QKV = (NH + 2 * NKV) * HD;
    const size_t nq = (size_t)N * QKV;
    const cpu::Fp8Format cf = fp8_cpu_format(grad);
    cudaStream_t s = ctx.stream;
    printf("dq cast: B=%d T=%d NH=%d NKV=%d HD=%d (N=%d, dQ columns %d of %d), dY %s%s\n", B, T, NH, NKV, HD, N, Q, QKV,
           fp8_format_name(grad), with_bias ? ", bias gradient" : "");
    floatX *d_qkv = upload(random_bf16(rng, nq, 1.0f)), *d_dout = upload(random_bf16(rng, (size_t)N * Q, 1.0f));
    floatX *d_out = poisoned((size_t)N * Q), *d_dqkv = poisoned(nq), *d_plain = poisoned(nq);
    float *d_lse = nullptr, *d_scratch = nullptr, *d_scratch2 = nullptr, *d_colsum = nullptr;
    const AttnShape shape{B, T, NH, NKV, HD};
    const size_t sf = attention_backward_scratch_floats(shape);
    cudaCheck(cudaMalloc(&d_lse, sizeof(float) * B * NH * T));
    cudaCheck(cudaMalloc(&d_scratch, sizeof(float) * sf));
    cudaCheck(cudaMalloc(&d_scratch2, sizeof(float) * sf));
    cudaCheck(cudaMalloc(&d_colsum, sizeof(float) * column_num_chunks(N) * QKV));
    attention_forward(d_out, d_lse, d_qkv, shape, ctx);
    const float* dq = attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, shape, ctx, {d_scratch, sf}, true);
    attention_backward(d_plain, d_dout, d_qkv, d_out, d_lse, shape, ctx, {d_scratch2, sf});
    cudaCheck(cudaStreamSynchronize(s));
    std::vector<uint16_t> kept(nq), plain(nq);
    cudaCheck(cudaMemcpy(kept.data(), d_dqkv, nq * 2, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(plain.data(), d_plain, nq * 2, cudaMemcpyDeviceToHost));
    size_t dq_written = 0, kv_diff = 0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < QKV; c++) {
            const size_t i = (size_t)n * QKV + c;
            if (c < Q) dq_written += kept[i] != 0xFFFF;
            else kv_diff += kept[i] != plain[i];
        }
    const bool api_ok = dq == d_scratch && dq_written == 0 && kv_diff == 0;
    printf("  attention_backward keep_dq: %s, dQ columns written %zu, dK/dV bits differing from the plain backward %zu  %s\n",
           dq == d_scratch ? "returned its scratch" : "returned something else", dq_written, kv_diff, api_ok ? "ok" : "FAIL");
    if (!api_ok) {
        failures++;
        for (floatX* p : {d_qkv, d_dout, d_out, d_dqkv, d_plain}) cudaCheck(cudaFree(p));
        for (float* p : {d_lse, d_scratch, d_scratch2, d_colsum}) cudaCheck(cudaFree(p));
        return;
    }

    // the reference dqkv: the dQ store the backward skipped, on the same sums
    std::vector<float> sums((size_t)N * Q);
    cudaCheck(cudaMemcpy(sums.data(), dq, sums.size() * sizeof(float), cudaMemcpyDeviceToHost));
    floatX* d_ref = poisoned(nq);
    cudaCheck(cudaMemcpy(d_ref, d_dqkv, nq * 2, cudaMemcpyDeviceToDevice));
    attention_dq_store(reinterpret_cast<__nv_bfloat16*>(d_ref), dq, shape, ctx);
    cudaCheck(cudaStreamSynchronize(s));
    const std::vector<float> x = device_to_float(d_ref, nq), xp = device_to_float(d_plain, nq);
    std::vector<float> dq_got((size_t)N * Q), dq_plain((size_t)N * Q), dq_sums((size_t)N * Q);
    size_t sum_bad = 0;
    const float rs = 1.0f / std::sqrt((float)HD);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < Q; c++) {
            const size_t i = (size_t)n * Q + c;
            dq_got[i] = x[(size_t)n * QKV + c], dq_plain[i] = xp[(size_t)n * QKV + c], dq_sums[i] = sums[i] * rs;
            sum_bad += !(std::fabs(dq_got[i] - dq_sums[i]) <= std::ldexp(std::fabs(dq_sums[i]), -8) + 1e-30f);  // (+: flushed subnormals)
        }
    check("stored dQ vs plain backward", dq_got, dq_plain);
    printf("  stored dQ vs the sums x 1/sqrt(HD): %zu of %zu beyond 1 bf16 step  %s\n", sum_bad, dq_sums.size(),
           sum_bad ? "FAIL" : "ok");
    if (sum_bad) failures++;

    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float scale = cpu::fp8_scale_from_amax(0.9f * amax, cf, 0, 1.0f);
    Fp8Meta m0;
    memset(&m0, 0, sizeof m0);
    m0.scale = scale, m0.scale_inv = 1.0f / scale, m0.fp8_max = fp8_format_max(grad);
    const std::vector<float> db0 = random_bf16(rng, QKV, 0.5f);
    // two runs: 0 the DQ_ACCUM cast from d_dqkv (dQ columns poisoned) and the sums, 1 the NONE cast of d_ref
    uint8_t *d8[2], *d8t[2];
    Fp8Meta* dm[2];
    floatX* ddb[2];
    for (int r = 0; r < 2; r++) {
        cudaCheck(cudaMalloc(&d8[r], nq));
        cudaCheck(cudaMalloc(&d8t[r], nq));
        cudaCheck(cudaMemset(d8[r], 0xFF, nq));
        cudaCheck(cudaMemset(d8t[r], 0xFF, nq));
        cudaCheck(cudaMalloc(&dm[r], sizeof(Fp8Meta)));
        cudaCheck(cudaMemcpy(dm[r], &m0, sizeof m0, cudaMemcpyHostToDevice));
        ddb[r] = upload(db0);
    }
    Fp8DqAccum dqa;
    dqa.accum = dq, dqa.q_cols = Q, dqa.head_dim = HD;
    fp8_cast_transpose_fused(d8t[0], d8[0], d_dqkv, nullptr, N, QKV, grad, dm[0], Fp8Prologue::DQ_ACCUM,
                             with_bias ? ddb[0] : nullptr, with_bias ? d_colsum : nullptr, s, dqa);
    fp8_cast_transpose_fused(d8t[1], d8[1], d_ref, nullptr, N, QKV, grad, dm[1], Fp8Prologue::NONE,
                             with_bias ? ddb[1] : nullptr, with_bias ? d_colsum : nullptr, s);
    cudaCheck(cudaStreamSynchronize(s));
    std::vector<uint8_t> o[2], ot[2];
    Fp8Meta mm[2];
    std::vector<float> db[2];
    for (int r = 0; r < 2; r++) {
        o[r].resize(nq), ot[r].resize(nq);
        cudaCheck(cudaMemcpy(o[r].data(), d8[r], nq, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(ot[r].data(), d8t[r], nq, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(&mm[r], dm[r], sizeof(Fp8Meta), cudaMemcpyDeviceToHost));
        db[r] = device_to_float(ddb[r], QKV);
    }
    size_t diff = 0, diff_t = 0, unwritten = 0, cpu_diff = 0, db_diff = 0;
    for (size_t i = 0; i < nq; i++) {
        diff += o[0][i] != o[1][i], diff_t += ot[0][i] != ot[1][i];
        unwritten += (o[0][i] == 0xFF) + (ot[0][i] == 0xFF);
        cpu_diff += o[0][i] != cpu::fp8_cast(x[i], scale, cf);
    }
    for (int n = 0; n < N; n++)  // dY^T (QKV, N) against the CPU's bytes of dY
        for (int c = 0; c < QKV; c++) cpu_diff += ot[0][(size_t)c * N + n] != cpu::fp8_cast(x[(size_t)n * QKV + c], scale, cf);
    for (int c = 0; c < QKV; c++) db_diff += memcmp(&db[0][c], &db[1][c], 4) != 0;
    uint32_t amax_bits;
    memcpy(&amax_bits, &amax, 4);
    const bool pair_ok = diff == 0 && diff_t == 0 && unwritten == 0 && mm[0].amax_bits == mm[1].amax_bits && db_diff == 0;
    printf("  DQ_ACCUM vs dQ store + NONE: dY %zu, dY^T %zu bytes differ, %zu unwritten, amax 0x%08X vs 0x%08X, "
           "bias gradient %zu differ  %s\n", diff, diff_t, unwritten, mm[0].amax_bits, mm[1].amax_bits, db_diff,
           pair_ok ? "ok" : "FAIL");
    const bool cpu_ok = cpu_diff == 0 && mm[0].amax_bits == amax_bits;
    printf("  DQ_ACCUM vs cpu::fp8_cast of the stored dqkv: %zu bytes differ, amax 0x%08X (cpu 0x%08X)  %s\n", cpu_diff,
           mm[0].amax_bits, amax_bits, cpu_ok ? "ok" : "FAIL");
    if (!pair_ok) failures++;
    if (!cpu_ok) failures++;
    if (with_bias) {
        std::vector<float> db_ref(QKV);
        for (int c = 0; c < QKV; c++) {
            double t = db0[c];
            for (int n = 0; n < N; n++) t += x[(size_t)n * QKV + c];
            db_ref[c] = (float)t;
        }
        check("bias gradient (+=) vs double", db[0], db_ref);
    }
    for (int r = 0; r < 2; r++) {
        cudaCheck(cudaFree(d8[r]));
        cudaCheck(cudaFree(d8t[r]));
        cudaCheck(cudaFree(dm[r]));
        cudaCheck(cudaFree(ddb[r]));
    }
    for (floatX* p : {d_qkv, d_dout, d_out, d_dqkv, d_plain, d_ref}) cudaCheck(cudaFree(p));
    for (float* p : {d_lse, d_scratch, d_scratch2, d_colsum}) cudaCheck(cudaFree(p));
}

// Where keep_dq must not take: no scratch (the deterministic backward) and, on the Hopper kernel, the
// split schedule (B 1, T 1024, NH 2: 16 key-tile items for 132 SMs): nullptr back and dqkv whole.
static void test_dq_kept_only_where_allowed(const CudaContext& ctx, Rng& rng) {
    const int B = 1, T = 1024, NH = 2, HD = 64, N = B * T, Q = NH * HD, QKV = 3 * Q;
    const size_t nq = (size_t)N * QKV;
    cudaStream_t s = ctx.stream;
    floatX *d_qkv = upload(random_bf16(rng, nq, 1.0f)), *d_dout = upload(random_bf16(rng, (size_t)N * Q, 1.0f));
    floatX *d_out = poisoned((size_t)N * Q), *d_dqkv = poisoned(nq);
    float *d_lse = nullptr, *d_scratch = nullptr;
    const AttnShape shape{B, T, NH, NH, HD};
    const size_t sf = attention_backward_scratch_floats_split(shape, ctx);
    cudaCheck(cudaMalloc(&d_lse, sizeof(float) * B * NH * T));
    cudaCheck(cudaMalloc(&d_scratch, sizeof(float) * sf));
    attention_forward(d_out, d_lse, d_qkv, shape, ctx);
    struct Case { const char* what; float* scratch; size_t floats; bool kept; };
    const bool hopper = attention_hopper_available(ctx);
    const Case cases[2] = {{"no scratch (deterministic)", nullptr, 0, false},
                           {hopper ? "Hopper split schedule" : "mma.sync single pass", d_scratch, sf, !hopper}};
    for (const Case& k : cases) {
        cudaCheck(cudaMemset(d_dqkv, 0xFF, nq * 2));
        const float* dq = attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, shape, ctx, {k.scratch, k.floats}, true);
        cudaCheck(cudaStreamSynchronize(s));
        std::vector<uint16_t> h(nq);
        cudaCheck(cudaMemcpy(h.data(), d_dqkv, nq * 2, cudaMemcpyDeviceToHost));
        size_t poisoned_left = 0;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < (k.kept ? Q : QKV); c++) poisoned_left += h[(size_t)n * QKV + c] == 0xFFFF;
        // kept: the dQ columns must all still be poisoned; else nothing may be
        const bool ok = (dq != nullptr) == k.kept && poisoned_left == (k.kept ? (size_t)N * Q : 0);
        printf("keep_dq with %s: %s, %zu poisoned values in %s  %s\n", k.what, dq ? "dQ kept" : "dqkv whole",
               poisoned_left, k.kept ? "the dQ columns" : "dqkv", ok ? "ok" : "FAIL");
        if (!ok) failures++;
    }
    for (floatX* p : {d_qkv, d_dout, d_out, d_dqkv}) cudaCheck(cudaFree(p));
    for (float* p : {d_lse, d_scratch}) cudaCheck(cudaFree(p));
}

// The trainer's plumbing of DQ_ACCUM (model_backward: the attention backward keeps dQ in its scratch,
// qkv's cast reads it there) on a d2 GPT-2 at B 4, T 256 (N 1024), --fp8 1 delayed with the fused
// casts: after a first step (current scaling) the same forward and backward run twice from the same
// parameters and batch, once as the trainer runs it and once with the dQ store (fp8.rope set for that
// run: fp8_dq_fused false, so the attention backward stores dQ and qkv's cast is NONE's). dQ's fp32
// atomics differ run to run (a few FP8 bytes, the delayed amax's last bits), so the gradients are held
// to the tolerance of the other checks, every qkv weight and bias gradient and then all of them: a wrong
// dQ in the cast (its columns, scale, pointer) is far outside it.
static void test_dq_model(const CudaContext& ctx, Rng& rng) {
    ModelConfig config = model_config_from_descriptor("d2");
    const int B = 4, T = 256, N = B * T;
    Model model;
    model.fp8.set.enabled = true;
    model.fp8.set.scaling = Fp8Scaling::DELAYED;
    model_build(model, config, B, T, false, ctx);
    {
        std::vector<float> host(model.num_params);
        model_init_params(host.data(), config, 18);
        model_set_params(model, host.data());
    }
    std::vector<int> tokens(2 * N);
    for (int& t : tokens) t = (int)rng.below(config.vocab_size);
    const int HD = model_head_dim(config), QKV = model_qkv_channels(config), C = config.channels, L = config.num_layers;
    printf("dq model: d2 (C %d, %d heads of %d), B=%d T=%d, --fp8 1 delayed, fused casts\n", C, config.num_heads, HD, B, T);
    const size_t nq = (size_t)N * QKV;
    const int Q = config.num_heads * HD;
    // dqkv (one layer's, reused) poisoned before each backward: with DQ_ACCUM in every layer its dQ
    // columns stay poisoned (and were never read: the gradients would be NaN), else none may
    auto step = [&](bool dq_in_cast) {
        model.fp8.rope = !dq_in_cast;  // (a GPT-2: only fp8_dq_fused reads it)
        model_upload_batch(model, tokens.data(), tokens.data() + N, B, T, true, ctx);
        model_forward(model, B, T, ctx);
        model_loss(model, B, T, 1.0f / N, true, ctx);
        model_zero_grads(model, ctx);
        cudaCheck(cudaMemsetAsync(model.acts.dqkv, 0xFF, nq * sizeof(floatX), ctx.stream));
        model_backward(model, B, T, ctx);
        cudaCheck(cudaStreamSynchronize(ctx.stream));
        std::vector<uint16_t> h(nq);
        cudaCheck(cudaMemcpy(h.data(), model.acts.dqkv, nq * 2, cudaMemcpyDeviceToHost));
        size_t left = 0;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < QKV; c++) left += h[(size_t)n * QKV + c] == 0xFFFF;
        const size_t want = dq_in_cast && model.fp8.warm ? (size_t)N * Q : 0;
        printf("  backward %s: %zu poisoned dqkv values left (want %zu)  %s\n",
               dq_in_cast ? "with DQ_ACCUM" : "with the dQ store", left, want, left == want ? "ok" : "FAIL");
        if (left != want) failures++;
        return device_to_float(model.grads_memory, model.num_params);
    };
    step(false);  // the first step: current scaling, the casts unfused; it starts the delayed histories
    model.fp8.rope = false;  // step(false) set it
    if (!fp8_fused(model.fp8) || !fp8_dq_fused(model.fp8, 0)) fail("test_dq_model: the fused casts are not on");
    const std::vector<float> fused = step(true), stored = step(false);
    // the qkv weight and bias gradients of every layer: (L, QKV, C) and (L, QKV) from the tensors' offsets
    auto slice = [](const std::vector<float>& v, size_t at, size_t n) { return std::vector<float>(v.begin() + at, v.begin() + at + n); };
    const size_t w_at = model.grads.qkvw - model.grads_memory, nw = (size_t)L * QKV * C;
    check("qkv weight gradients", slice(fused, w_at, nw), slice(stored, w_at, nw));
    if (model.grads.qkvb) {
        const size_t b_at = model.grads.qkvb - model.grads_memory, nb = (size_t)L * QKV;
        check("qkv bias gradients", slice(fused, b_at, nb), slice(stored, b_at, nb));
    }
    check("all gradients", fused, stored);
    model_free(model);
}

int main(int argc, char** argv) {
    if (argc > 1) {
        printf("usage: %s (no flags): the FP8 linear layers of --fp8 against the CPU reference\n", argv[0]);
        return strcmp(argv[1], "--help") == 0 ? 0 : 1;
    }
    if (!HAS_MASTER) fail("test_fp8_gpu: build it in bf16 (the FP8 matmuls write bf16)");
    CudaContext ctx;
    ctx.init(0);
    if (ctx.props.major * 10 + ctx.props.minor < 89) fail("test_fp8_gpu: %s has no FP8 tensor cores (sm_89+)", ctx.props.name);
    Rng rng(18);
    const ModelConfig config = model_config_from_descriptor("d2");
    struct Recipe { Fp8Scaling scaling; bool wgrad_bf16; };
    const Recipe recipes[] = {{Fp8Scaling::CURRENT, false}, {Fp8Scaling::DELAYED, false}, {Fp8Scaling::ROWWISE, false},
                              {Fp8Scaling::ROWWISE, true}};
    for (const Recipe& r : recipes)
        for (Fp8Format grad : {Fp8Format::E5M2, Fp8Format::E4M3}) {
            for (int B : {3, 16}) {  // T = 64: N = 192, 1024
                Model model;
                model.fp8.set.enabled = true;
                model.fp8.set.scaling = r.scaling;
                model.fp8.set.wgrad_bf16 = r.wgrad_bf16;
                model.fp8.set.grad = grad;
                model_build(model, config, B, 64, false, ctx);
                const int N = B * 64;
                // one linear at a time: under delayed scaling the GELU stays out of the casts here
                // (fp8_gelu_fused spans fc and fcproj), test_mlp runs it in; the X of qkv and fc is
                // cast by the linear, not by a LayerNorm (fp8_norm_fused: the tests call the linears
                // alone; dev/cuda/fp8_cast.cu checks layernorm_fp8_forward, dev/bench/fp8_same.sh the
                // trainer with it against the separate casts)
                const bool gelu_mlp = model.fp8.gelu;
                model.fp8.gelu = false;
                model.fp8.layernorm = false;
                test_linear(model, FP8_QKV, "qkv", false, false, N, rng, ctx);
                test_linear(model, FP8_ATTPROJ, "attproj", false, false, N, rng, ctx);
                test_linear(model, FP8_FC, "fc", true, false, N, rng, ctx);
                test_linear(model, FP8_FCPROJ, "fcproj", false, true, N, rng, ctx);
                model.fp8.gelu = gelu_mlp;
                if (r.scaling == Fp8Scaling::DELAYED) test_mlp(model, N, rng, ctx);
                model_free(model);
            }
        }
    test_cast_weights(ctx, rng, 0);
    test_cast_weights(ctx, rng, 1);
    // the output head (--fp8-head 1): N below Vp (vocabulary chunks) and above it (token ranges, 576 + 512),
    // both gradient formats; then GPT-2's vocabulary at a few rows
    for (Fp8Format grad : {Fp8Format::E5M2, Fp8Format::E4M3})
        for (int B : {3, 17}) test_head(ctx, rng, grad, B, 1000, 1024);
    test_head(ctx, rng, Fp8Format::E5M2, 2, 50257, 50304);
    // a row too wide for two a SM in shared memory (130 KB): the classifier's block-per-row fallback
    test_head(ctx, rng, Fp8Format::E4M3, 1, 65000, 65024);
    // qkv's dY cast from the attention backward's dQ sums (DQ_ACCUM): GPT-2's HD 64 with the bias at
    // N = 1024 (the bias chunks whole tiles), three heads at N = 640 (q_cols 3 tiles of 9), HD 128
    // without a bias at N = 192, GQA at N = 256; then where keep_dq must not take
    for (Fp8Format grad : {Fp8Format::E5M2, Fp8Format::E4M3}) {
        test_dq_cast(ctx, rng, grad, 4, 256, 4, 4, 64, true);
        test_dq_cast(ctx, rng, grad, 2, 320, 3, 3, 64, true);
        test_dq_cast(ctx, rng, grad, 3, 64, 2, 2, 128, false);
        test_dq_cast(ctx, rng, grad, 2, 128, 4, 2, 64, true);  // GQA: dqkv (N, (4 + 2 x 2) 64)
    }
    test_dq_kept_only_where_allowed(ctx, rng);
    test_dq_model(ctx, rng);
    ctx.destroy();
    printf("%s: %d check(s) failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
