// test_fp8_cpu: the CPU FP8 reference of llmc/cpu/fp8.h, which the GPU casts are checked against
// bit for bit (dev/cuda/fp8_cast.cu), so it must itself be right:
//  - known bit patterns in both formats: 1.0, max normal (448 / 57344), min normal, subnormals,
//    negative zero, saturation of finite overflow and infinity, NaN, ties to even (between
//    subnormals, between normals, and the tie that carries into the next binade);
//  - every bit pattern decodes to a value that encodes back to it (E5M2's infinity saturates);
//  - every bf16 value (all 65536 patterns) and a million random floats encode to the nearest FP8
//    value, ties to the even mantissa, found by brute force over the 256 decoded patterns;
//  - the scale recipe: amax 0 or non-finite keeps the previous scale, the margin, the cap;
//  - the rowwise scales (fp8_row_scales): each row's own amax, sign ignored, a zero / inf / NaN row
//    at scale 1, a tiny row capped.
// Run: build/test_fp8_cpu (well under a second).
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/cpu/fp8.h"
#include "llmc/formats.h"
#include "llmc/rand.h"
#include "tests/cpu/check.h"

using cpu::Fp8Format;

static const char* fp8_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

static void expect(Fp8Format f, float x, uint8_t bits) {
    const uint8_t got = cpu::fp8_encode(x, f);
    CHECK(got == bits, "%s encode(%.9g) = 0x%02X, want 0x%02X", fp8_name(f), x, got, bits);
}

static float bf16_value(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

// The nearest finite FP8 value to x (|x| <= max), ties to the pattern with an even mantissa,
// by trying all 128 non-negative patterns.
static uint8_t brute_force(float x, Fp8Format f) {
    const float a = std::fabs(x);
    int best = -1;
    double best_d = 0;
    for (int b = 0; b < 128; b++) {
        const float v = cpu::fp8_decode((uint8_t)b, f);
        if (!std::isfinite(v)) continue;
        const double d = std::fabs((double)v - (double)a);
        if (best < 0 || d < best_d || (d == best_d && (b & 1) == 0)) best = b, best_d = d;
    }
    return (uint8_t)((std::signbit(x) ? 0x80 : 0) | best);
}

static void check_nearest(Fp8Format f, float x) {
    if (std::isnan(x)) return;
    const float a = std::fabs(x);
    const uint8_t want = a > cpu::fp8_max(f) ? (uint8_t)((std::signbit(x) ? 0x80 : 0) | cpu::fp8_spec(f).max_bits)
                                             : brute_force(x, f);
    const uint8_t got = cpu::fp8_encode(x, f);
    CHECK(got == want, "%s encode(%.9g) = 0x%02X, nearest is 0x%02X", fp8_name(f), x, got, want);
}

// Runs fn in a child whose stderr goes to a file; returns its exit status and the first line it wrote.
template <typename F>
static int child_fails(const std::string& log, std::string* line, F fn) {
    fflush(stdout);
    if (fork() == 0) {
        if (!freopen(log.c_str(), "w", stderr)) _exit(2);
        fn();
        _exit(0);
    }
    int status = 0;
    wait(&status);
    char buf[512] = "";
    FILE* f = fopen(log.c_str(), "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    *line = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static std::string read_text(const std::string& path) {
    std::string text;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return text;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    fclose(f);
    return text;
}

// The FP8 scales of an --fp8 checkpoint (GPT8 in llmc/formats.h, fp8.bin in llmc/checkpoint.h): they
// round-trip, DONE lists and verifies them, and a damaged, foreign or misplaced one is refused.
static void check_fp8_state_file() {
    char root[] = "/tmp/test_fp8_state_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); CHECK(false, "mkdtemp"); return; }
    const std::string out = root;
    const std::string tmp = checkpoint_begin(out, 7);
    { AtomicFileWriter w(tmp + "/model.bin"); w.write("model", 5); w.commit(); }
    TrainState ts;
    ts.step = 7;
    ts.num_params = 4;
    const float m[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    state_write((tmp + "/state.bin").c_str(), ts, m, v, nullptr);
    Fp8State fs;
    fs.step = 7, fs.records = 6, fs.record_words = 3, fs.warm = 1;
    std::vector<uint32_t> words(18);
    for (size_t i = 0; i < words.size(); i++) words[i] = 0x3f800000u + (uint32_t)i * 977u;
    fp8_state_write((tmp + "/" + fp8_state_file_name(0, 1)).c_str(), fs, words.data());
    checkpoint_finish(tmp);
    const std::string dir = out + "/step_00000007", path = dir + "/fp8.bin";
    CHECK(checkpoint_problem(dir).empty(), "a checkpoint with fp8.bin does not verify: %s", checkpoint_problem(dir).c_str());
    CHECK(read_text(dir + "/DONE").find("\nfp8.bin ") != std::string::npos, "DONE does not list fp8.bin");
    std::vector<uint32_t> back;
    const Fp8State got = fp8_state_read(path.c_str(), 6, 3, &back);
    CHECK(got.step == 7 && got.warm == 1 && back == words, "fp8.bin does not read back what was written");
    CHECK(fp8_state_file_to_read(dir, 3) == path, "rank 3 of a resume at another world size does not find fp8.bin");
    CHECK(fp8_state_file_name(2, 4) == "fp8_00002.bin" && is_fp8_state_file("fp8_00002.bin") &&
          !is_fp8_state_file("fp8_2.bin") && !is_fp8_state_file("fp8.bin.tmp"), "the FP8 state file names are wrong");
    std::string line;
    int rc = child_fails(out + "/err.txt", &line, [&] { fp8_state_read(path.c_str(), 5, 3, &back); });
    CHECK(rc == 1 && line.find("holds 6 FP8 scales") != std::string::npos, "scales of another model were read: %s", line.c_str());
    rc = child_fails(out + "/err.txt", &line, [&] { fp8_state_read((dir + "/state.bin").c_str(), 6, 3, &back); });
    CHECK(rc == 1 && line.find("a training state file, not an FP8 scaling state file") != std::string::npos,
          "a state.bin was read as FP8 scales: %s", line.c_str());
    // a manifest that lists fp8.bin before any state file is not a checkpoint's
    const std::string done = read_text(dir + "/DONE");
    const size_t state_at = done.find("state.bin "), fp8_at = done.find("fp8.bin ");
    std::string swapped = done.substr(0, state_at) + done.substr(fp8_at) + done.substr(state_at, fp8_at - state_at);
    { AtomicFileWriter w(dir + "/DONE"); w.write(swapped.data(), swapped.size()); w.commit(); }
    CHECK(checkpoint_problem(dir) == "DONE has no entry for state.bin", "fp8.bin in place of state.bin: %s",
          checkpoint_problem(dir).c_str());
    { AtomicFileWriter w(dir + "/DONE"); w.write(done.data(), done.size()); w.commit(); }
    // damaged (one byte changed), then truncated
    std::string bytes = read_text(path);
    bytes[HEADER_BYTES + 5] ^= 1;
    { AtomicFileWriter w(path); w.write(bytes.data(), bytes.size()); w.commit(); }
    CHECK(checkpoint_problem(dir) == "fp8.bin does not match the checksum in DONE", "a damaged fp8.bin: %s",
          checkpoint_problem(dir).c_str());
    { AtomicFileWriter w(path); w.write(bytes.data(), bytes.size() - 4); w.commit(); }
    rc = child_fails(out + "/err.txt", &line, [&] { fp8_state_read(path.c_str(), 6, 3, &back); });
    CHECK(rc == 1 && line.find("truncated") != std::string::npos, "a truncated fp8.bin was read: %s", line.c_str());
    for (const char* name : {"DONE", "model.bin", "state.bin", "fp8.bin"}) remove((dir + "/" + name).c_str());
    rmdir(dir.c_str());
    remove((out + "/err.txt").c_str());
    rmdir(root);
}

int main() {
    const Fp8Format E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
    // ---- E4M3: bias 7, 3 mantissa bits
    expect(E4, 1.0f, 0x38);
    expect(E4, -1.0f, 0xB8);
    expect(E4, 0.0f, 0x00);
    expect(E4, -0.0f, 0x80);
    expect(E4, 448.0f, 0x7E);                  // max normal
    expect(E4, -448.0f, 0xFE);
    expect(E4, 240.0f, 0x77);                  // 1.875 * 2^7
    expect(E4, 456.0f, 0x7E);                  // above max (would round down anyway)
    expect(E4, 464.0f, 0x7E);                  // the tie beyond max saturates, never NaN
    expect(E4, 1e6f, 0x7E);                    // finite overflow saturates
    expect(E4, INFINITY, 0x7E);                // so does infinity (satfinite)
    expect(E4, -INFINITY, 0xFE);
    expect(E4, std::ldexp(1.0f, -6), 0x08);    // min normal
    expect(E4, std::ldexp(7.0f, -9), 0x07);    // max subnormal
    expect(E4, std::ldexp(1.0f, -9), 0x01);    // min subnormal
    expect(E4, std::ldexp(1.0f, -10), 0x00);   // half the min subnormal: tie to even (zero)
    expect(E4, -std::ldexp(1.0f, -10), 0x80);  //   ... of its sign
    expect(E4, std::ldexp(1.0001f, -10), 0x01);
    expect(E4, std::ldexp(3.0f, -10), 0x02);   // 1.5 subnormal units: tie, to 2 (even)
    expect(E4, std::ldexp(5.0f, -10), 0x02);   // 2.5 units: tie, to 2 (even)
    expect(E4, std::ldexp(15.0f, -10), 0x08);  // 7.5 units: tie, up into the min normal
    expect(E4, 1.0625f, 0x38);                 // 1 + 2^-4, halfway 1.0 / 1.125: to 1.0 (even)
    expect(E4, 1.1875f, 0x3A);                 // halfway 1.125 / 1.25: to 1.25 (even)
    expect(E4, 1.9375f, 0x40);                 // halfway 1.875 / 2.0: carries into the next binade
    expect(E4, 1.05f, 0x38);                   // nearer 1.0
    expect(E4, 1.1f, 0x39);                    // nearer 1.125
    CHECK(std::isnan(cpu::fp8_decode(cpu::fp8_encode(NAN, E4), E4)), "e4m3: NaN does not stay NaN");
    CHECK(std::isnan(cpu::fp8_decode(0x7F, E4)) && std::isnan(cpu::fp8_decode(0xFF, E4)), "e4m3: 0x7F/0xFF not NaN");
    CHECK(cpu::fp8_decode(0x7E, E4) == 448.0f && cpu::fp8_decode(0x01, E4) == std::ldexp(1.0f, -9), "e4m3 decode");
    // ---- E5M2: bias 15, 2 mantissa bits
    expect(E5, 1.0f, 0x3C);
    expect(E5, -2.0f, 0xC0);
    expect(E5, -0.0f, 0x80);
    expect(E5, 57344.0f, 0x7B);                // max normal
    expect(E5, -57344.0f, 0xFB);
    expect(E5, 61440.0f, 0x7B);                // the tie beyond max saturates (not infinity)
    expect(E5, 1e9f, 0x7B);
    expect(E5, INFINITY, 0x7B);
    expect(E5, -INFINITY, 0xFB);
    expect(E5, std::ldexp(1.0f, -14), 0x04);   // min normal
    expect(E5, std::ldexp(3.0f, -16), 0x03);   // max subnormal
    expect(E5, std::ldexp(1.0f, -16), 0x01);   // min subnormal
    expect(E5, std::ldexp(1.0f, -17), 0x00);   // tie to zero
    expect(E5, std::ldexp(3.0f, -17), 0x02);   // 1.5 units: tie to 2
    expect(E5, std::ldexp(7.0f, -17), 0x04);   // 3.5 units: tie up into the min normal
    expect(E5, 1.125f, 0x3C);                  // halfway 1.0 / 1.25: to 1.0
    expect(E5, 1.375f, 0x3E);                  // halfway 1.25 / 1.5: to 1.5
    expect(E5, 1.875f, 0x40);                  // halfway 1.75 / 2.0: carries
    CHECK(std::isinf(cpu::fp8_decode(0x7C, E5)) && cpu::fp8_decode(0xFC, E5) < 0, "e5m2: 0x7C/0xFC not +-inf");
    CHECK(std::isnan(cpu::fp8_decode(0x7D, E5)) && std::isnan(cpu::fp8_decode(0x7F, E5)), "e5m2: 0x7D..0x7F not NaN");
    CHECK(std::isnan(cpu::fp8_decode(cpu::fp8_encode(-NAN, E5), E5)), "e5m2: NaN does not stay NaN");
    // ---- every pattern decodes and encodes back
    for (Fp8Format f : {E4, E5})
        for (int b = 0; b < 256; b++) {
            const float v = cpu::fp8_decode((uint8_t)b, f);
            if (std::isnan(v)) continue;
            const uint8_t want = std::isinf(v) ? (uint8_t)((b & 0x80) | cpu::fp8_spec(f).max_bits) : (uint8_t)b;
            const uint8_t got = cpu::fp8_encode(v, f);
            CHECK(got == want, "%s round trip 0x%02X -> %g -> 0x%02X", fp8_name(f), b, v, got);
        }
    // ---- nearest value, ties to even: all bf16 values, and random floats over the whole FP8 range
    for (Fp8Format f : {E4, E5}) {
        for (int b = 0; b < 65536; b++) check_nearest(f, bf16_value((uint16_t)b));
        Rng rng(1234 + (int)f);
        for (int i = 0; i < 1000000; i++) {
            // a random binade from far below the subnormals to above the max, uniform mantissa
            const float x = std::ldexp(1.0f + rng.uniform(), (int)rng.below(40) - 24) * (rng.below(2) ? -1.0f : 1.0f);
            check_nearest(f, x);
        }
    }
    // ---- the scale recipe
    CHECK(cpu::fp8_scale_from_amax(448.0f, E4, 0, 3.0f) == 1.0f, "scale(448, e4m3) != 1");
    CHECK(cpu::fp8_scale_from_amax(448.0f, E4, 1, 3.0f) == 0.5f, "margin 1 does not halve the scale");
    CHECK(cpu::fp8_scale_from_amax(2.0f, E5, 0, 3.0f) == 28672.0f, "scale(2, e5m2) != 28672");
    CHECK(cpu::fp8_scale_from_amax(0.0f, E4, 0, 3.0f) == 3.0f, "amax 0 must keep the previous scale");
    CHECK(cpu::fp8_scale_from_amax(INFINITY, E4, 0, 3.0f) == 3.0f, "amax inf must keep the previous scale");
    CHECK(cpu::fp8_scale_from_amax(NAN, E4, 0, 3.0f) == 3.0f, "amax NaN must keep the previous scale");
    CHECK(cpu::fp8_scale_from_amax(1e-30f, E4, 0, 3.0f) == cpu::FP8_SCALE_CAP, "tiny amax must cap the scale");
    const float s075 = cpu::fp8_scale_from_amax(0.75f, E4, 0, 1.0f);
    CHECK(cpu::fp8_cast(0.75f, s075, E4) == 0x7E && cpu::fp8_cast(-0.75f, s075, E4) == 0xFE,
          "the amax must land on the max normal");

    // ---- the fixed power-of-two scale of --fp8-head's dlogits: the largest 2^k with bound * 2^k <= max
    CHECK(cpu::fp8_pow2_scale(1.0f / 65536, E5) == 2147483648.0f, "pow2 scale of 2^-16 (e5m2) = %g, want 2^31",
          cpu::fp8_pow2_scale(1.0f / 65536, E5));
    CHECK(cpu::fp8_pow2_scale(1.0f / 65536, E4) == 16777216.0f, "pow2 scale of 2^-16 (e4m3) = %g, want 2^24",
          cpu::fp8_pow2_scale(1.0f / 65536, E4));
    CHECK(cpu::fp8_pow2_scale(448.0f, E4) == 1.0f && cpu::fp8_pow2_scale(449.0f, E4) == 0.5f,
          "pow2 scale at e4m3's max: %g and %g, want 1 and 0.5", cpu::fp8_pow2_scale(448.0f, E4),
          cpu::fp8_pow2_scale(449.0f, E4));
    CHECK(cpu::fp8_pow2_scale(0.0f, E5) == 1.0f && cpu::fp8_pow2_scale(NAN, E5) == 1.0f &&
              cpu::fp8_pow2_scale(INFINITY, E5) == 1.0f, "pow2 scale of 0 / NaN / inf must be 1");
    for (float bound = 1e-12f; bound < 1e6f; bound *= 1.37f)
        for (Fp8Format f : {E4, E5}) {
            const float s = cpu::fp8_pow2_scale(bound, f);
            CHECK(bound * s <= cpu::fp8_max(f) && 2.0f * bound * s > cpu::fp8_max(f),
                  "pow2 scale of %g (%s) = %g: bound * scale %g not in (max / 2, max]", bound, fp8_name(f), s,
                  bound * s);
        }

    // ---- rowwise scales: rows (2, -448, 1), (0, 0, 0), (1, inf, 2), (NaN, 3, 1), (-2, 0.5, 1e-30)
    {
        const float x[15] = {2.0f, -448.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, INFINITY, 2.0f, NAN, 3.0f, 1.0f,
                             -2.0f, 0.5f, 1e-30f};
        float sc[5];
        cpu::fp8_row_scales(sc, x, 5, 3, E4);
        CHECK(sc[0] == 1.0f, "row scale of (2, -448, 1) = %g, want 1 (|-448| is the amax)", sc[0]);
        CHECK(sc[1] == 1.0f && sc[2] == 1.0f && sc[3] == 1.0f, "zero / inf / NaN rows: scales %g %g %g, want 1", sc[1],
              sc[2], sc[3]);
        CHECK(sc[4] == 224.0f, "row scale of (-2, 0.5, 1e-30) = %g, want 224", sc[4]);
        cpu::fp8_row_scales(sc, x + 13, 1, 2, E5);
        CHECK(sc[0] == 114688.0f, "e5m2 row scale of (0.5, 1e-30) = %g, want 114688", sc[0]);
        const float tiny[2] = {1e-30f, -1e-31f};
        cpu::fp8_row_scales(sc, tiny, 1, 2, E4);
        CHECK(sc[0] == cpu::FP8_SCALE_CAP, "a tiny row must cap its scale");
    }

    check_fp8_state_file();

    printf("test_fp8_cpu: %d checks, %d failed\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}
