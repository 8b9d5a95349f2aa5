// sampler.h: sampling helpers shared by both trainers and the generators: the token a sample
// starts from, the next token from one row of logits, and printing a sample.
// The next token: temperature 0 is greedy (the first largest logit, no RNG draw). Otherwise a
// softmax at `temperature` over the first V logits (the padded columns are never drawn), then
// transformers' filters in its order: top-k keeps the tokens whose logit is at least the k-th
// largest (ties at the k-th are kept), top-p keeps, in descending probability, each token whose
// predecessors' mass is below p (at least the top token), and one multinomial draw over the kept
// tokens in id order from the shared RNG: one uniform per token, so a resumed run that restores the
// RNG state draws the same text. With top_k = 0 and top_p = 1 nothing is filtered and the draw is
// the trainers' plain one.
#pragma once
#include <algorithm>
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

inline int sample_token(const float* logits, int V, float temperature, Rng& rng, int top_k = 0, float top_p = 1.0f) {
    int best = 0;
    for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
    if (temperature == 0.0f) return best;
    const float maxv = logits[best];
    std::vector<double> weights(V);
    for (int v = 0; v < V; v++) weights[v] = std::exp((double)(logits[v] - maxv) / temperature);
    if ((top_k > 0 && top_k < V) || top_p < 1.0f) {
        std::vector<int> order(V);  // ids by descending logit (= descending weight), ties by id
        for (int v = 0; v < V; v++) order[v] = v;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
        int kept = V;
        if (top_k > 0 && top_k < V) {
            kept = top_k;
            while (kept < V && logits[order[kept]] == logits[order[top_k - 1]]) kept++;
        }
        if (top_p < 1.0f) {
            double total = 0.0, before = 0.0;
            for (int i = 0; i < kept; i++) total += weights[order[i]];
            int n = 0;
            while (n < kept && before < top_p * total) before += weights[order[n++]];
            kept = n;
        }
        for (int i = kept; i < V; i++) weights[order[i]] = 0.0;
    }
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += weights[v];
    double r = rng.uniform() * sum;
    int last = best;  // the highest kept id, for rounding that leaves r >= 0 after the last weight
    for (int v = 0; v < V; v++) {
        if (weights[v] == 0.0) continue;
        r -= weights[v];
        last = v;
        if (r < 0) return v;
    }
    return last;
}

// Prints the tokens as text with a tokenizer, else as ids, then a newline.
inline void print_sample(const Tokenizer* tok, const std::vector<int>& tokens) {
    for (int t : tokens) {
        if (tok) tok->print_token(t);
        else printf("%d ", t);
    }
    printf("\n");
}
