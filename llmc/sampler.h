// sampler.h: the next token from one row of logits, shared by both trainers' sampling.
// Softmax at `temperature` over the first V logits (the padded columns are never drawn), then one
// multinomial draw from the shared RNG: one uniform per token, so a resumed run that restores the
// RNG state draws the same text.
#pragma once
#include <cmath>
#include <vector>
#include "llmc/rand.h"

inline int sample_token(const float* logits, int V, float temperature, Rng& rng) {
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++) maxv = logits[v] > maxv ? logits[v] : maxv;
    std::vector<double> weights(V);
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += weights[v] = std::exp((double)(logits[v] - maxv) / temperature);
    double r = rng.uniform() * sum;
    for (int v = 0; v < V; v++) {
        r -= weights[v];
        if (r < 0) return v;
    }
    return V - 1;  // rounding left r >= 0 after the last weight
}
