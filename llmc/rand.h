// rand.h: the one deterministic RNG of the project (splitmix64), identical on every platform and
// compiler, used for parameter init, sampling and data shuffling. Its whole state is one uint64, so
// checkpoints store it in a single header slot and a resumed run continues the same stream.
#pragma once
#include <cmath>
#include <cstdint>

struct Rng {
    uint64_t state;
    static constexpr uint64_t STEP = 0x9E3779B97F4A7C15ull;  // the state advances by this per draw
    explicit Rng(uint64_t seed = 0) : state(seed) {}
    // The generator whose next draw is the (n+1)-th draw of Rng(seed): the state is a counter, so
    // element n of a random tensor can be computed without drawing the n before it.
    static Rng skip(uint64_t seed, uint64_t n) { return Rng(seed + n * STEP); }
    uint64_t next_u64() {
        uint64_t z = (state += STEP);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // uniform in [0, 1) with 24 random bits, exactly representable as float
    float uniform() { return (float)(next_u64() >> 40) * (1.0f / 16777216.0f); }
    // uniform integer in [0, n); the bias for n << 2^64 is negligible
    uint64_t below(uint64_t n) { return next_u64() % n; }
    // standard normal via Box-Muller in double, one value per call (keeps the stream simple)
    float normal() {
        double u1 = ((double)(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
        double u2 = (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
        return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
};

// Fisher-Yates shuffle of n elements.
template <typename T>
inline void rng_shuffle(Rng& rng, T* a, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng.below((uint64_t)i + 1);
        T t = a[i]; a[i] = a[j]; a[j] = t;
    }
}
