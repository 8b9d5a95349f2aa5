// hellaswag.h: multiple-choice accuracy (HellaSwag) of a model during training, from the
// per-position losses its forward pass already computes. Both trainers use it; C++17, no CUDA.
//
// The eval file (GPTE, docs/formats.md, written by scripts/data/hellaswag.py) is read and
// validated by EvalLoader (llmc/dataloader.h): magic, version, header sizes against the file
// length, every record's lengths, labels and token ids, with the file named in each error.
// An example is a context and K completions (K = 4 for HellaSwag); EvalLoader lays completion k
// out as row k: inputs = context + completion, targets shifted by one, mask = 1 where the target
// is a completion token. A forward pass takes rows() = (B / K) * K rows of seq() tokens, i.e.
// B / K examples; seq() is the longest row of the file (max_row_tokens - 1 inputs), at most the
// trainer's T, so short HellaSwag rows do not pay for a 1024-token sequence.
//
// The score is llm.c's "acc_norm": for each completion the mean cross-entropy over its own
// tokens (predicted after the context), and the model picks the completion with the lowest one
// (the first of equal ones). Padded positions are masked out; attention is causal, so padding
// after a row never changes the positions that are scored.
#pragma once
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include "llmc/dataloader.h"
#include "llmc/formats.h"
#include "llmc/utils.h"

struct HellaSwagScore {
    int64_t examples = 0;             // scored examples (the whole file)
    int64_t correct = 0;              // examples whose lowest-loss completion is the labelled one
    int num_choices = 0;              // K
    std::vector<float> norm_losses;   // (examples, K): mean loss over each completion's tokens
    std::vector<int> labels, picks;   // (examples): the right completion, the model's choice
    double accuracy() const { return examples > 0 ? (double)correct / (double)examples : 0.0; }
};

// Adds the examples of one batch to `score`. losses, mask: (rows, T) as the forward pass and
// EvalLoader lay them out; labels: (rows / K), -1 for an empty example slot (skipped).
inline void hellaswag_score_batch(HellaSwagScore& score, const float* losses, const int* mask, const int* labels,
                                  int rows, int T, int K) {
    for (int e = 0; e < rows / K; e++) {
        if (labels[e] < 0) continue;
        int pick = 0;
        float best = 0.0f;
        for (int k = 0; k < K; k++) {
            const int64_t row = (int64_t)(e * K + k) * T;
            double sum = 0.0;
            int n = 0;
            for (int t = 0; t < T; t++) {
                if (!mask[row + t]) continue;
                sum += losses[row + t];
                n++;
            }
            const float norm = n > 0 ? (float)(sum / n) : 0.0f;  // EvalLoader masks >= 1 token per completion
            score.norm_losses.push_back(norm);
            if (k == 0 || norm < best) {
                best = norm;
                pick = k;
            }
        }
        score.labels.push_back(labels[e]);
        score.picks.push_back(pick);
        score.correct += pick == labels[e];
        score.examples++;
    }
}

class HellaSwagEval {
  public:
    // path: the eval file; B, T: the largest batch the model was built for (the trainer's --batch
    // and --seq); vocab_size: the model's (every token id must be below it); data_vocab: --data-vocab
    // (check_data_vocab: the vocab_size the file's header must record; 0 = the model's).
    HellaSwagEval(const char* path, int B, int T, int vocab_size, int data_vocab = 0) : path_(path) {
        const FileHeader hd = open_checked(path, MAGIC_EVAL).hd;  // magic and version; EvalLoader checks the rest
        check_range(path, "vocab_size", hd.h[3], 1, 65536);
        check_data_vocab(path, hd.h[3], data_vocab, vocab_size);
        check_range(path, "num_choices", hd.h[4], 2, 64);
        check_range(path, "max_row_tokens", hd.h[5], 2, 65535);
        const int K = (int)hd.h[4], longest = (int)hd.h[5] - 1;  // inputs of the longest row
        if (B < K)
            fail("--hellaswag %s: --batch %d is below the %d completions of one example (one forward scores B / %d "
                 "examples)", path, B, K, K);
        if (T < longest)
            fail("--hellaswag %s: its longest example has %d tokens, so --seq must be at least %d (it is %d)", path,
                 longest + 1, longest, T);
        rows_ = B / K * K;
        seq_ = longest;
        loader_.reset(new EvalLoader(path, rows_, seq_, 0, 1, vocab_size));
    }

    int rows() const { return rows_; }  // rows per forward pass: B / K examples
    int seq() const { return seq_; }    // tokens per row
    int64_t num_examples() const { return loader_->num_examples(); }
    const std::string& path() const { return path_; }

    // Scores every example. forward_losses(inputs, targets, B, T) runs the model on (B, T) token
    // ids and returns its (B, T) per-position cross-entropy losses (host memory, valid until the
    // next call).
    template <class ForwardLosses>
    HellaSwagScore run(ForwardLosses&& forward_losses) {
        HellaSwagScore score;
        score.num_choices = loader_->num_choices();
        loader_->reset();
        for (int b = 0; b < loader_->num_batches(); b++) {
            loader_->next_batch();
            const float* losses = forward_losses(loader_->inputs(), loader_->targets(), rows_, seq_);
            hellaswag_score_batch(score, losses, loader_->mask(), loader_->labels(), rows_, seq_, score.num_choices);
        }
        return score;
    }

  private:
    std::string path_;
    int rows_ = 0, seq_ = 0;
    std::unique_ptr<EvalLoader> loader_;
};

// The line both trainers print and log (docs/formats.md, "Log lines"), without the newline.
inline std::string hellaswag_log_line(int64_t step, const HellaSwagScore& s) {
    char buf[160];
    snprintf(buf, sizeof buf, "step %" PRId64 " hellaswag_acc %.6f correct %" PRId64 " examples %" PRId64, step,
             s.accuracy(), s.correct, s.examples);
    return buf;
}
