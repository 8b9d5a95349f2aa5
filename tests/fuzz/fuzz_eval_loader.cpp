// fuzz_eval_loader: the multiple-choice eval file reader (GPTE, HellaSwag; EvalLoader in
// llmc/dataloader.h) and every batch it builds. B and T are taken from the input's own header
// (two examples per batch, T = max_row_tokens - 1) so the fuzzer gets past those checks to the
// records; rank 1 of 2 runs as well as rank 0 of 1.
// Invariants: ids are below vocab_size, labels are -1 (empty slot) or a valid choice, a row's
// mask covers only completion targets, and each example slot has at least one masked position.
#include <vector>
#include "llmc/dataloader.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("eval.bin");
    const char* path = file.set(data, size);
    const int64_t K = header_slot(data, size, 4, 4), max_row = header_slot(data, size, 5, 2);
    const int B = (K >= 2 && K <= 64) ? 2 * (int)K : 8;
    const int T = (max_row >= 2 && max_row <= 65535) ? (int)max_row - 1 : 16;
    const int vocab = 50257;
    for (int world = 1; world <= 2; world++) {
        try {
            EvalLoader el(path, B, T, world - 1, world, vocab);
            FUZZ_CHECK(el.num_batches() >= 1 && el.num_choices() == K);
            for (int b = 0; b <= el.num_batches(); b++) {
                el.next_batch();
                for (int e = 0; e < B / el.num_choices(); e++) {
                    const int label = el.labels()[e];
                    FUZZ_CHECK(label >= -1 && label < el.num_choices());
                    for (int k = 0; k < el.num_choices(); k++) {
                        const int row = e * el.num_choices() + k;
                        int masked = 0;
                        for (int t = 0; t < T; t++) {
                            const int i = row * T + t;
                            FUZZ_CHECK(el.inputs()[i] >= 0 && el.inputs()[i] < vocab);
                            FUZZ_CHECK(el.targets()[i] >= 0 && el.targets()[i] < vocab);
                            FUZZ_CHECK(el.mask()[i] == 0 || el.mask()[i] == 1);
                            masked += el.mask()[i];
                        }
                        FUZZ_CHECK(label == -1 ? masked == 0 : masked >= 1);
                    }
                }
            }
        } catch (const FailError&) {
        }
    }
    return 0;
}
