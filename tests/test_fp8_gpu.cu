// test_fp8_gpu.cu: the FP8 linear layers of --fp8 (llmc/gpt2_fp8.cuh) against the CPU reference.
//   build/test_fp8_gpu        (make build/test_fp8_gpu; bf16 build; needs a GPU with FP8, sm_89+)
// A d2 GPT-2 (C 128, H 512, QKV 384) is built with --fp8 1 at N = B*T rows, and each linear layer
// of its first block (qkv 128->384, fc 128->512 with GELU, fcproj 512->128, and attproj 128->128)
// runs fp8_linear_forward then fp8_linear_backward, the trainer's calls, on fresh random bf16 X,
// W, bias, dY, and dW, dbias holding random values (they accumulate, +=); fc with its GELU, fcproj's
// input gradient through dGELU at a random pre-activation. dY in e5m2, then again in e4m3. Three
// recipes: per-tensor current scaling (FP8 weight gradient), rowwise scaling with the FP8 weight
// gradient, rowwise with the bf16 weight gradient (--fp8-wgrad bf16).
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
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include "llmc/gpt2.cuh"
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
static void test_linear(GPT2& model, int k, const char* name, bool gelu, bool dgelu, int N, Rng& rng,
                        const CudaContext& ctx) {
    GPT2Fp8& f = model.fp8;
    const int C = f.cin[k], OC = f.oc[k];
    const bool rowwise = f.set.scaling == Fp8Scaling::ROWWISE, wgrad_fp8 = !f.set.wgrad_bf16;
    printf("%s: N=%d, %d -> %d%s%s, dY %s, %s scaling, weight gradient %s\n", name, N, C, OC, gelu ? ", GELU" : "",
           dgelu ? ", dGELU" : "", fp8_format_name(f.set.grad), rowwise ? "rowwise" : "current",
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
        const fp8_detail::LinearBuffers b = fp8_detail::linear_buffers(f, 0, k);
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
    const GPT2Config config = gpt2_config_from_descriptor("d2");
    struct Recipe { Fp8Scaling scaling; bool wgrad_bf16; };
    const Recipe recipes[] = {{Fp8Scaling::CURRENT, false}, {Fp8Scaling::ROWWISE, false}, {Fp8Scaling::ROWWISE, true}};
    for (const Recipe& r : recipes)
        for (Fp8Format grad : {Fp8Format::E5M2, Fp8Format::E4M3}) {
            for (int B : {3, 16}) {  // T = 64: N = 192, 1024
                GPT2 model;
                model.fp8.set.enabled = true;
                model.fp8.set.scaling = r.scaling;
                model.fp8.set.wgrad_bf16 = r.wgrad_bf16;
                model.fp8.set.grad = grad;
                gpt2_build(model, config, B, 64, false, ctx);
                const int N = B * 64;
                test_linear(model, FP8_QKV, "qkv", false, false, N, rng, ctx);
                test_linear(model, FP8_ATTPROJ, "attproj", false, false, N, rng, ctx);
                test_linear(model, FP8_FC, "fc", true, false, N, rng, ctx);
                test_linear(model, FP8_FCPROJ, "fcproj", false, true, N, rng, ctx);
                gpt2_free(model);
            }
        }
    ctx.destroy();
    printf("%s: %d check(s) failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
