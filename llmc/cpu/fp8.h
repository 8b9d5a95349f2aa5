// fp8.h: the FP8 formats on the CPU, bit by bit: the reference the GPU casts of llmc/fp8.cuh are
// checked against bit-exactly (dev/cuda/fp8_cast.cu), and the decoder the FP8 matmul lab uses to
// rebuild the operands cuBLASLt read (dev/cuda/matmul_fp8.cu). Plain C++, no CUDA headers.
//
// The two OCP FP8 formats (sign, exponent, mantissa; docs/numerics.md, "The two formats"):
//   E4M3 (bias 7):  max normal 448 (0x7E), min subnormal 2^-9; no infinity, NaN S.1111.111 (0x7F / 0xFF)
//   E5M2 (bias 15): max normal 57344 (0x7B), min subnormal 2^-16; infinity S.11111.00 (0x7C / 0xFC),
//                   NaN S.11111.{01,10,11}
// fp8_encode rounds to nearest, ties to even, and saturates: finite values beyond the max and
// +-infinity become +-max (the GPU's cvt.rn.satfinite); NaN stays NaN (0x7F | sign); values below
// half the smallest subnormal become a zero of their sign.
#pragma once
#include <cmath>
#include <cstdint>

namespace cpu {

enum class Fp8Format { E4M3, E5M2 };

struct Fp8Spec {
    int man_bits;      // mantissa bits
    int min_exp;       // exponent of the smallest normal (1 - bias)
    int bias;
    float max;         // largest finite value
    uint8_t max_bits;  // its bit pattern (positive)
};
constexpr Fp8Spec fp8_spec(Fp8Format f) {
    return f == Fp8Format::E4M3 ? Fp8Spec{3, -6, 7, 448.0f, 0x7E} : Fp8Spec{2, -14, 15, 57344.0f, 0x7B};
}
constexpr float fp8_max(Fp8Format f) { return fp8_spec(f).max; }

// Round to nearest, ties to even; saturating (see the header comment).
inline uint8_t fp8_encode(float x, Fp8Format f) {
    const Fp8Spec s = fp8_spec(f);
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return sign | 0x7F;
    const float a = std::fabs(x);
    if (a > s.max) return sign | s.max_bits;  // finite overflow and infinity saturate
    if (a == 0.0f) return sign;
    // The binade of a (subnormals share the smallest normal's), and the spacing of FP8 values there.
    int e = std::ilogb(a);
    if (e < s.min_exp) e = s.min_exp;
    const int q_exp = e - s.man_bits;             // spacing 2^q_exp
    const float r = std::ldexp(a, -q_exp);        // a in units of the spacing: exact (power of 2)
    float n = std::floor(r);
    const float frac = r - n;                     // exact: r < 2^(man_bits + 1) has few integer bits
    if (frac > 0.5f || (frac == 0.5f && std::fmod(n, 2.0f) == 1.0f)) n += 1.0f;
    // value = n * 2^q_exp with n <= 2^(man_bits + 1); n == 2^(man_bits + 1) is the next binade's first
    // value, which the encoding below handles by carrying into the exponent field (never past max:
    // a <= max and max is a representable value, so rounding cannot pass it).
    const int ni = (int)n;
    const int implicit = 1 << s.man_bits;
    int exp_field, man_field;
    if (ni < implicit) {                          // subnormal (only possible at e == min_exp)
        exp_field = 0;
        man_field = ni;
    } else if (ni == 2 * implicit) {              // rounded up into the next binade
        exp_field = e + 1 + s.bias;
        man_field = 0;
    } else {
        exp_field = e + s.bias;
        man_field = ni - implicit;
    }
    return (uint8_t)(sign | (exp_field << s.man_bits) | man_field);
}

// The value of an FP8 bit pattern (E4M3 0x7F/0xFF and E5M2 0x7D..0x7F are NaN, E5M2 0x7C is inf).
inline float fp8_decode(uint8_t b, Fp8Format f) {
    const Fp8Spec s = fp8_spec(f);
    const int exp_bits = 7 - s.man_bits;
    const int exp_field = (b >> s.man_bits) & ((1 << exp_bits) - 1), man_field = b & ((1 << s.man_bits) - 1);
    const float sign = (b & 0x80) ? -1.0f : 1.0f;
    if (f == Fp8Format::E4M3 && exp_field == 15 && man_field == 7) return NAN;
    if (f == Fp8Format::E5M2 && exp_field == 31) return man_field ? NAN : sign * INFINITY;
    if (exp_field == 0) return sign * std::ldexp((float)man_field, s.min_exp - s.man_bits);
    return sign * std::ldexp((float)(man_field | (1 << s.man_bits)), exp_field - s.bias - s.man_bits);
}

// The scaled cast of llmc/fp8.cuh: x * scale rounded once in fp32, then to FP8.
inline uint8_t fp8_cast(float x, float scale, Fp8Format f) { return fp8_encode(x * scale, f); }

// The scale recipe of llmc/fp8.cuh's fp8_update_scales, for one tensor: from the largest amax of
// the history window, scale = (fp8 max / amax) / 2^margin (IEEE division, then an exact power of 2),
// capped at FP8_SCALE_CAP; an amax of 0 (all-zero tensor, or an empty history) or a non-finite one
// keeps `prev`. scale_inv = 1 / scale (correctly rounded) is what the matmul multiplies back by.
constexpr float FP8_SCALE_CAP = 18446744073709551616.0f;  // 2^64
inline float fp8_scale_from_amax(float amax, Fp8Format f, int margin, float prev) {
    if (!(amax > 0.0f) || !std::isfinite(amax)) return prev;
    const float s = std::ldexp(fp8_max(f) / amax, -margin);
    return s < FP8_SCALE_CAP ? s : FP8_SCALE_CAP;
}

// A fixed scale for a tensor known to lie within [-bound, bound] before it exists (the output head's
// dlogits, |dloss * (softmax - onehot)| <= dloss): the largest power of two s (at most FP8_SCALE_CAP)
// with bound * s <= the format's max, so nothing saturates and 1 / s is exact. A bound that is not a
// positive finite number gives 1.
inline float fp8_pow2_scale(float bound, Fp8Format f) {
    if (!(bound > 0.0f) || !std::isfinite(bound)) return 1.0f;
    int e = 0;
    std::frexp(fp8_max(f) / bound, &e);  // max / bound in [2^(e-1), 2^e)
    float s = std::ldexp(1.0f, e - 1);
    while (bound * s > fp8_max(f)) s *= 0.5f;    // the division rounded up across a power of two
    return s < FP8_SCALE_CAP ? s : FP8_SCALE_CAP;
}

// Rowwise scaling (llmc/fp8.cuh's fp8_cast_rowwise, fp8_cast_transpose_colwise): one scale per row of
// an operand as the matmul reads it, from that row's own amax by the rule above with margin 0 and no
// history; a row of zeros (or one holding inf or NaN) gets scale 1.
inline float fp8_row_scale(float row_amax, Fp8Format f) { return fp8_scale_from_amax(row_amax, f, 0, 1.0f); }
// scale[r] (R) of the rows of x (R, C) row-major; |NaN| counts as above every value, as on the GPU.
inline void fp8_row_scales(float* scale, const float* x, int R, int C, Fp8Format f) {
    for (int r = 0; r < R; r++) {
        float amax = 0.0f;
        for (int c = 0; c < C; c++) {
            const float a = std::fabs(x[(size_t)r * C + c]);
            if (std::isnan(a) || a > amax) amax = std::isnan(amax) ? amax : a;
        }
        scale[r] = fp8_row_scale(amax, f);
    }
}

}  // namespace cpu
