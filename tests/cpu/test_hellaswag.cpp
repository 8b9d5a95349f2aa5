// test_hellaswag_cpu: the CPU model's HellaSwag scores (llmc/hellaswag.h) of every example of an
// eval file, printed in the format of `scripts/train_gpt2.py --hellaswag` so tests/python/test_hellaswag.py
// can compare them, example by example, with PyTorch and with its own numpy forward pass.
//   build/test_hellaswag_cpu MODEL EVAL_FILE B
// B: rows per forward pass (B / K examples), to check the score does not depend on the batching.
#include <cstdio>
#include <vector>
#include "llmc/cpu/model.h"
#include "llmc/hellaswag.h"

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL EVAL_FILE B\n", argv[0]);
        return 2;
    }
    int64_t B;
    if (!parse_int64(argv[3], &B) || B < 1 || B > 4096) fail("B: '%s' is not an integer in [1, 4096]", argv[3]);
    const ModelFileInfo info = model_read_info(argv[1]);
    const ModelConfig& c = info.config;
    Model model;
    model_build(model, c, (int)B, c.max_seq_len);
    {
        std::vector<float> params(model.num_params);
        model_read_fp32(argv[1], params.data());
        model_set_params(model, params.data());
    }
    HellaSwagEval eval(argv[2], (int)B, c.max_seq_len, c.vocab_size);
    const HellaSwagScore s = eval.run([&](const int* inputs, const int* targets, int rows, int T) {
        model_forward(model, inputs, rows, T);
        model_loss(model, targets);
        return model.acts.losses.data();
    });
    const int K = s.num_choices;
    for (int64_t i = 0; i < s.examples; i++) {
        printf("example %lld label %d pick %d norm_losses", (long long)i, s.labels[i], s.picks[i]);
        for (int k = 0; k < K; k++) printf(" %.9g", s.norm_losses[i * K + k]);
        printf("\n");
    }
    printf("hellaswag acc_norm %.6f correct %lld examples %lld\n", s.accuracy(), (long long)s.correct,
           (long long)s.examples);
    return 0;
}
