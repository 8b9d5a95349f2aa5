// sampler.h: sampling helpers shared by both trainers (and, later, the generator): the token a
// sample starts from, the next token from one row of logits, and printing a sample.
// Softmax at `temperature` over the first V logits (the padded columns are never drawn), then one
// multinomial draw from the shared RNG: one uniform per token, so a resumed run that restores the
// RNG state draws the same text.
#pragma once
#include <cmath>
#include <cstdio>
#include <vector>
#include "llmc/rand.h"
#include "llmc/tokenizer.h"

// The end-of-text token a sample starts from: the tokenizer's, else GPT-2's id 50256 when the
// vocabulary has it, else 0.
inline int sampling_eot(const Tokenizer* tok, int V) {
    return tok && tok->eot_token() >= 0 ? tok->eot_token() : (V > 50256 ? 50256 : 0);
}

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

// Prints the tokens as text with a tokenizer, else as ids, then a newline.
inline void print_sample(const Tokenizer* tok, const std::vector<int>& tokens) {
    for (int t : tokens) {
        if (tok) tok->print_token(t);
        else printf("%d ", t);
    }
    printf("\n");
}
