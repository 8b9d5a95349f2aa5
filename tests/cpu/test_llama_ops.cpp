// test_llama_ops_cpu: checks the Llama-family CPU reference ops against PyTorch: RMSNorm and the
// fused residual-add + RMSNorm (llmc/cpu/rmsnorm.h), RoPE (llmc/cpu/rope.h) and SwiGLU
// (llmc/cpu/swiglu.h), forward and backward; and the RoPE tables with Llama 3.x's llama3 frequency
// scaling, through rope_tables and through a model config's rope_tables_for.
// tests/fixture/llama_ops.bin is written by tests/fixture/make_llama_ops_fixture.py (float64 PyTorch
// formulas and autograd, with the conventions asserted equal to Hugging Face transformers'
// LlamaRMSNorm, apply_rotary_pos_emb, LlamaRotaryEmbedding, LlamaMLP and the llama3 rope scaling's
// inverse frequencies; regenerate with
// `python3 tests/fixture/make_llama_ops_fixture.py`).
// Outputs written with `=` are poisoned with NaN first, so an element left unwritten fails; the
// `+=` gradients start at zero (the fused backward at the incoming residual gradient), and a second
// backward into the same buffers must give exactly twice the first (the += convention).
// Every tensor: max |ours - ref| / max |ref| below 1e-5 (reference float64, ours fp32); the RoPE
// tables, computed in double and rounded once, below 1e-7.
// Prints one line per check and `test_llama_ops_cpu: PASSED (N checks)` or FAILED; exits 1 on failure.
// Usage: build/test_llama_ops_cpu [fixture path]   (default tests/fixture/llama_ops.bin)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"
#include "tests/cpu/fixture_check.h"

static const int64_t MAGIC_LLAMA_OPS = fourcc("GPTL");
static const double TOLERANCE = 1e-5;
static const double TABLE_TOLERANCE = 1e-7;

static CheckTally g_tally;
using Vec = std::vector<float>;

static void compare(const char* case_name, const char* tensor, const Vec& ours, const Vec& ref,
                    double tolerance = TOLERANCE) {
    double max_ref;
    const double e = rel_err(ours.data(), ref.data(), 1, 0, 0, (int64_t)ref.size(), &max_ref);
    g_tally.report(case_name, tensor, e, max_ref, tolerance);
}

static Vec take(FixtureReader& rd, int64_t n, const char* what) {
    Vec v(n);
    rd.take(v.data(), sizeof(float), n, what);
    return v;
}

static bool twice(const Vec& once, const Vec& again) {  // again == 2 * once, exactly
    for (size_t i = 0; i < once.size(); i++)
        if (again[i] != 2.0f * once[i]) return false;
    return true;
}

static void check_rmsnorm(FixtureReader& rd) {
    int64_t dims[3];
    double eps;
    rd.take(dims, sizeof(int64_t), 3, "rmsnorm sizes");
    rd.take(&eps, sizeof(double), 1, "rmsnorm eps");
    for (int64_t d : dims) check_range(rd.path, "rmsnorm size", d, 1, 1 << 16);
    const int B = (int)dims[0], T = (int)dims[1], C = (int)dims[2];
    const int64_t BT = (int64_t)B * T, N = BT * C;
    const Vec inp = take(rd, N, "inp"), weight = take(rd, C, "weight"), dout = take(rd, N, "dout");
    const Vec ref_out = take(rd, N, "out"), ref_rstd = take(rd, BT, "rstd"), ref_dinp = take(rd, N, "dinp"),
              ref_dweight = take(rd, C, "dweight");

    Vec out(N, NAN), rstd(BT, NAN), dinp(N, 0.0f), dweight(C, 0.0f);
    cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), B, T, C, (float)eps);
    cpu::rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), B, T, C);
    char name[96];
    snprintf(name, sizeof name, "rmsnorm B=%d T=%d C=%d eps=%g", B, T, C, eps);
    compare(name, "out", out, ref_out);
    compare(name, "rstd", rstd, ref_rstd);
    compare(name, "dinp", dinp, ref_dinp);
    compare(name, "dweight", dweight, ref_dweight);
    const Vec dinp1 = dinp, dweight1 = dweight;
    cpu::rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), B, T, C);
    g_tally.expect(name, "backward accumulates (+=) into dinp and dweight", twice(dinp1, dinp) && twice(dweight1, dweight));
}

static void check_fused(FixtureReader& rd) {
    int64_t dims[3];
    double eps;
    rd.take(dims, sizeof(int64_t), 3, "fused sizes");
    rd.take(&eps, sizeof(double), 1, "fused eps");
    for (int64_t d : dims) check_range(rd.path, "fused size", d, 1, 1 << 16);
    const int B = (int)dims[0], T = (int)dims[1], C = (int)dims[2];
    const int64_t BT = (int64_t)B * T, N = BT * C;
    const Vec inp1 = take(rd, N, "inp1"), inp2 = take(rd, N, "inp2"), weight = take(rd, C, "weight"),
              dout = take(rd, N, "dout"), dresidual_in = take(rd, N, "dresidual");
    const Vec ref_residual = take(rd, N, "residual"), ref_out = take(rd, N, "out"), ref_rstd = take(rd, BT, "rstd"),
              ref_dres = take(rd, N, "dres_total"), ref_dweight = take(rd, C, "dweight");

    Vec residual(N, NAN), out(N, NAN), rstd(BT, NAN), dresidual = dresidual_in, dweight(C, 0.0f);
    cpu::fused_residual_rmsnorm_forward(residual.data(), out.data(), rstd.data(), inp1.data(), inp2.data(),
                                        weight.data(), B, T, C, (float)eps);
    cpu::fused_residual_rmsnorm_backward(dresidual.data(), dweight.data(), dout.data(), residual.data(),
                                         weight.data(), rstd.data(), B, T, C);
    char name[96];
    snprintf(name, sizeof name, "fused B=%d T=%d C=%d eps=%g", B, T, C, eps);
    compare(name, "residual", residual, ref_residual);
    compare(name, "out", out, ref_out);
    compare(name, "rstd", rstd, ref_rstd);
    compare(name, "dres_total", dresidual, ref_dres);
    compare(name, "dweight", dweight, ref_dweight);
}

static void check_rope(FixtureReader& rd) {
    int64_t dims[6];
    double theta;
    rd.take(dims, sizeof(int64_t), 6, "rope sizes");
    rd.take(&theta, sizeof(double), 1, "rope theta");
    const char* names[6] = {"B", "T", "NH", "NKV", "HD", "pos_offset"};
    for (int i = 0; i < 5; i++) check_range(rd.path, names[i], dims[i], 1, 4096);
    check_range(rd.path, names[5], dims[5], 0, 1 << 20);
    const int B = (int)dims[0], T = (int)dims[1], NH = (int)dims[2], NKV = (int)dims[3], HD = (int)dims[4],
              P0 = (int)dims[5];
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HD, N = (int64_t)B * T * QKV, half = HD / 2;
    const Vec qkv_in = take(rd, N, "qkv"), dqkv_rot = take(rd, N, "dqkv_rot");
    const Vec ref_cos = take(rd, T * half, "cos"), ref_sin = take(rd, T * half, "sin"),
              ref_qkv = take(rd, N, "qkv_rot"), ref_dqkv = take(rd, N, "dqkv");

    const int max_pos = P0 + T;
    Vec cos((size_t)max_pos * half, NAN), sin((size_t)max_pos * half, NAN);
    cpu::rope_tables(cos.data(), sin.data(), max_pos, HD, (float)theta);
    Vec qkv = qkv_in, dqkv = dqkv_rot;
    cpu::rope_forward(qkv.data(), cos.data(), sin.data(), B, T, NH, NKV, HD, P0);
    cpu::rope_backward(dqkv.data(), cos.data(), sin.data(), B, T, NH, NKV, HD, P0);

    char name[96];
    snprintf(name, sizeof name, "rope B=%d T=%d NH=%d NKV=%d HD=%d p0=%d", B, T, NH, NKV, HD, P0);
    compare(name, "cos", Vec(cos.begin() + (size_t)P0 * half, cos.end()), ref_cos, TABLE_TOLERANCE);
    compare(name, "sin", Vec(sin.begin() + (size_t)P0 * half, sin.end()), ref_sin, TABLE_TOLERANCE);
    compare(name, "qkv_rot", qkv, ref_qkv);
    compare(name, "dqkv", dqkv, ref_dqkv);
    bool v_same = true;  // the V heads, forward and backward, bit for bit
    const int64_t v_off = (int64_t)(NH + NKV) * HD;
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int64_t c = v_off; c < QKV; c++)
            v_same = v_same && qkv[r * QKV + c] == qkv_in[r * QKV + c] && dqkv[r * QKV + c] == dqkv_rot[r * QKV + c];
    g_tally.expect(name, "V and dV untouched", v_same);
}

// The tables with llama3 scaling: rope_tables with the scaling, and rope_tables_for of a config
// holding it (what the models call), against PyTorch's rows; and they differ from the unscaled tables
// (so the case tests the scaling at all).
static void check_rope_scaled(FixtureReader& rd) {
    int64_t dims[4];
    double par[4];
    rd.take(dims, sizeof(int64_t), 4, "rope_scaled sizes");
    rd.take(par, sizeof(double), 4, "rope_scaled parameters");
    check_range(rd.path, "HD", dims[0], 2, 4096);
    check_range(rd.path, "pos_offset", dims[1], 0, 1 << 20);
    check_range(rd.path, "T", dims[2], 1, 4096);
    check_range(rd.path, "original_max_position_embeddings", dims[3], 1, 1 << 24);
    const int HD = (int)dims[0], P0 = (int)dims[1], T = (int)dims[2], half = HD / 2, max_pos = P0 + T;
    RopeScaling r;
    r.type = ROPE_SCALING_LLAMA3;
    r.factor = par[1];
    r.low_freq_factor = par[2];
    r.high_freq_factor = par[3];
    r.original_max_pos = (int)dims[3];
    const Vec ref_cos = take(rd, (int64_t)T * half, "cos"), ref_sin = take(rd, (int64_t)T * half, "sin");

    char name[160];
    snprintf(name, sizeof name, "rope llama3 HD=%d p0=%d T=%d theta=%g factor=%g low=%g high=%g original=%d", HD, P0,
             T, par[0], r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_pos);
    const auto rows = [&](const Vec& table) { return Vec(table.begin() + (size_t)P0 * half, table.end()); };
    Vec cos((size_t)max_pos * half, NAN), sin((size_t)max_pos * half, NAN);
    cpu::rope_tables(cos.data(), sin.data(), max_pos, HD, par[0], r);
    compare(name, "cos", rows(cos), ref_cos, TABLE_TOLERANCE);
    compare(name, "sin", rows(sin), ref_sin, TABLE_TOLERANCE);

    ModelConfig c = model_shape(1, 2 * HD, 2, 100);  // two heads of HD
    c.architecture = ARCH_LLAMA;
    c.norm = NORM_RMSNORM;
    c.norm_eps = 1e-5;
    c.position = POS_ROPE;
    c.rope_theta = par[0];
    c.rope_scaling = r;
    model_validate_config(c, name);
    Vec cos_c((size_t)max_pos * half, NAN), sin_c((size_t)max_pos * half, NAN);
    cpu::rope_tables_for(c, cos_c.data(), sin_c.data(), max_pos);
    g_tally.expect(name, "rope_tables_for(config) == rope_tables(theta, scaling)", cos_c == cos && sin_c == sin);

    Vec cos0((size_t)max_pos * half), sin0((size_t)max_pos * half);
    cpu::rope_tables(cos0.data(), sin0.data(), max_pos, HD, par[0]);
    double max_diff = 0.0;
    for (size_t i = (size_t)P0 * half; i < cos0.size(); i++) max_diff = std::max(max_diff, (double)std::fabs(sin0[i] - sin[i]));
    g_tally.expect(name, "the scaled tables differ from the unscaled ones (by > 0.01)", max_diff > 0.01);
}

static void check_swiglu(FixtureReader& rd) {
    int64_t dims[2];
    rd.take(dims, sizeof(int64_t), 2, "swiglu sizes");
    for (int64_t d : dims) check_range(rd.path, "swiglu size", d, 1, 1 << 16);
    const int N = (int)dims[0], H = (int)dims[1];
    const int64_t NH = (int64_t)N * H;
    const Vec inp = take(rd, 2 * NH, "inp"), dout = take(rd, NH, "dout");
    const Vec ref_out = take(rd, NH, "out"), ref_dinp = take(rd, 2 * NH, "dinp");

    Vec out(NH, NAN), dinp(2 * NH, 0.0f);
    cpu::swiglu_forward(out.data(), inp.data(), N, H);
    cpu::swiglu_backward(dinp.data(), dout.data(), inp.data(), N, H);
    char name[96];
    snprintf(name, sizeof name, "swiglu N=%d H=%d", N, H);
    compare(name, "out", out, ref_out);
    double max_ref;
    double e = rel_err(dinp.data(), ref_dinp.data(), N, 2 * H, 0, H, &max_ref);
    g_tally.report(name, "dgate", e, max_ref, TOLERANCE);
    e = rel_err(dinp.data(), ref_dinp.data(), N, 2 * H, H, H, &max_ref);
    g_tally.report(name, "dup", e, max_ref, TOLERANCE);
    const Vec dinp1 = dinp;
    cpu::swiglu_backward(dinp.data(), dout.data(), inp.data(), N, H);
    g_tally.expect(name, "backward accumulates (+=) into dinp", twice(dinp1, dinp));
}

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "tests/fixture/llama_ops.bin";
    FileHeader hd;
    FixtureReader rd = open_fixture(path, MAGIC_LLAMA_OPS, "a Llama ops fixture (\"GPTL\")", &hd);
    for (int i = 2; i <= 6; i++) check_range(path, "number of cases", hd.h[i], 0, 64);
    for (int64_t c = 0; c < hd.h[2]; c++) check_rmsnorm(rd);
    for (int64_t c = 0; c < hd.h[3]; c++) check_fused(rd);
    for (int64_t c = 0; c < hd.h[4]; c++) check_rope(rd);
    for (int64_t c = 0; c < hd.h[5]; c++) check_swiglu(rd);
    for (int64_t c = 0; c < hd.h[6]; c++) check_rope_scaled(rd);
    rd.finish();
    return g_tally.finish("test_llama_ops_cpu");
}
