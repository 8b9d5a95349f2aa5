// fuzz_hellaswag: the trainers' HellaSwag scoring (HellaSwagEval in llmc/hellaswag.h) on any eval
// file: its own header checks and the flag-named errors, then EvalLoader's reading, then the
// scoring of every example. B is the trainer's batch (K * 2 + 1, not a multiple of K, and 1: too
// small) and T the file's longest row (from its header) plus 0 or 3.
// The "model" returns as the loss at each position its target token id, so the score of a
// completion must be the mean of its token ids. The target checks that against the records it
// reads from the raw bytes itself, for every file HellaSwagEval accepts; also that every example
// is scored once, with a label and pick in [0, K).
#include <vector>
#include "llmc/hellaswag.h"
#include "tests/fuzz/fuzz_common.h"

// The records of an accepted file, read straight from the payload: label, then per choice the
// mean of the completion's token ids.
struct Record {
    int label;
    std::vector<double> mean_ids;
};
static std::vector<Record> read_records(const uint8_t* data, size_t size, int K) {
    std::vector<Record> out;
    const size_t n = (size - HEADER_BYTES) / 2;
    std::vector<uint16_t> v(n);
    memcpy(v.data(), data + HEADER_BYTES, n * 2);
    for (size_t pos = 0; pos < n;) {
        Record r;
        r.label = v[pos];
        const size_t nctx = v[pos + 1];
        size_t tok = pos + 2 + K + nctx;  // the first completion's first token
        for (int k = 0; k < K; k++) {
            const size_t len = v[pos + 2 + k];
            double sum = 0.0;
            for (size_t i = 0; i < len; i++) sum += v[tok + i];
            r.mean_ids.push_back(sum / len);
            tok += len;
        }
        out.push_back(r);
        pos = tok;
    }
    return out;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("hellaswag.bin");
    const char* path = file.set(data, size);
    const int64_t K = header_slot(data, size, 4, 4), max_row = header_slot(data, size, 5, 2);
    const int longest = (max_row >= 2 && max_row <= 65535) ? (int)max_row - 1 : 16;
    const int vocab = 50257;
    const int batches[2] = {(K >= 2 && K <= 64) ? 2 * (int)K + 1 : 9, 1};
    for (int B : batches) {
        for (int extra : {0, 3}) {
            try {
                HellaSwagEval eval(path, B, longest + extra, vocab);
                FUZZ_CHECK(eval.rows() % K == 0 && eval.rows() <= B && eval.seq() == longest);
                std::vector<float> losses;
                const HellaSwagScore s = eval.run([&](const int* inputs, const int* targets, int rows, int T) {
                    FUZZ_CHECK(rows == eval.rows() && T == eval.seq());
                    losses.assign((size_t)rows * T, 0.0f);
                    for (size_t i = 0; i < losses.size(); i++) {
                        FUZZ_CHECK(inputs[i] >= 0 && inputs[i] < vocab && targets[i] >= 0 && targets[i] < vocab);
                        losses[i] = (float)targets[i];
                    }
                    return losses.data();
                });
                const std::vector<Record> recs = read_records(data, size, (int)K);
                FUZZ_CHECK(s.num_choices == K && s.examples == eval.num_examples() && s.examples == (int64_t)recs.size());
                FUZZ_CHECK(s.labels.size() == recs.size() && s.picks.size() == recs.size());
                FUZZ_CHECK(s.norm_losses.size() == recs.size() * K && s.correct >= 0 && s.correct <= s.examples);
                int64_t correct = 0;
                for (size_t e = 0; e < recs.size(); e++) {
                    FUZZ_CHECK(s.labels[e] == recs[e].label && s.picks[e] >= 0 && s.picks[e] < K);
                    correct += s.picks[e] == s.labels[e];
                    for (int k = 0; k < K; k++) {
                        const double want = recs[e].mean_ids[k], got = s.norm_losses[e * K + k];
                        FUZZ_CHECK(got >= want - 1e-3 * (1 + want) && got <= want + 1e-3 * (1 + want));
                        FUZZ_CHECK(got >= s.norm_losses[e * K + s.picks[e]]);  // the pick is a lowest score
                    }
                }
                FUZZ_CHECK(correct == s.correct);
            } catch (const FailError&) {
            }
        }
    }
    return 0;
}
