// fuzz_flags: the trainers' command line (FlagParser with add_train_flags, then
// validate_train_config, in llmc/train_config.h). The input is argv[1..], one argument per line.
// `--help` and `-h` print the usage and exit 0 by design, so they are dropped from the input.
// Invariants for an accepted command line: B, T and the derived grad_accum are positive and
// total_batch = grad_accum * B * T.
#include <string>
#include <vector>
#include "llmc/train_config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> args = {"train_gpt2_cpu"};
    std::string arg;
    for (size_t i = 0; i <= size; i++) {
        if (i == size || data[i] == '\n') {
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
        p.parse((int)argv.size(), argv.data());
        validate_train_config(cfg);
    } catch (const FailError&) {
        return 0;
    }
    FUZZ_CHECK(cfg.B >= 1 && cfg.T >= 1 && cfg.grad_accum >= 1);
    FUZZ_CHECK(cfg.total_batch == (int64_t)cfg.grad_accum * cfg.B * cfg.T);
    return 0;
}
