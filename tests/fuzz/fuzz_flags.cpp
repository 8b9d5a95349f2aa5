// fuzz_flags: the trainers' command line (FlagParser with add_train_flags and the GPU trainer's add_fp8_flags, then
// validate_train_config, in llmc/train_config.h). The input is argv[1..], one argument per line,
// each cut at its first NUL as a C string would be. `--help` and `-h` print the usage and exit 0
// by design, so they are dropped from the input.
// Invariants for an accepted command line: B, T and the derived grad_accum are positive,
// grad_accum is at most 2^20 and total_batch = grad_accum * B * T (issue 13: a large --total-batch
// overflowed grad_accum); --steps is not 0; no path value starts with "--" (issue 13: `--out-dir
// --log` made a directory named --log).
#include <string>
#include <vector>
#include "llmc/train_config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> args = {"train_gpt2_cpu"};
    std::string arg;
    for (size_t i = 0; i <= size; i++) {
        if (i == size || data[i] == '\n') {
            arg = arg.c_str();
            if (arg != "--help" && arg != "-h") args.push_back(arg);
            arg.clear();
        } else {
            arg += (char)data[i];
        }
    }
    if (args.size() > 64) return 0;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(&a[0]);
    TrainConfig cfg;
    try {
        FlagParser p("train_gpt2_cpu", "fuzz");
        add_train_flags(p, cfg);
        add_fp8_flags(p, cfg);
        p.parse((int)argv.size(), argv.data());
        validate_train_config(cfg);
    } catch (const FailError&) {
        return 0;
    }
    FUZZ_CHECK(cfg.B >= 1 && cfg.T >= 1 && cfg.grad_accum >= 1 && cfg.grad_accum <= (1 << 20));
    FUZZ_CHECK(cfg.total_batch == (int64_t)cfg.grad_accum * cfg.B * cfg.T);
    FUZZ_CHECK(cfg.steps != 0);
    for (const std::string* s : {&cfg.train_pattern, &cfg.val_pattern, &cfg.tokenizer_path, &cfg.init,
                                 &cfg.resume_dir, &cfg.out_dir, &cfg.log_path})
        FUZZ_CHECK(s->compare(0, 2, "--") != 0);
    return 0;
}
