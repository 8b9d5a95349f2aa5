// fuzz_descriptor: the model config descriptor of --init (`dN`, `gpt2*`, `llama:L..,C..,H..`,
// model_config_from_descriptor in llmc/model_config.h), then --kv-heads / --window applied to the
// fresh model as the trainers do.
// The input is the descriptor; its first two bytes, when present after a NUL, are the
// --kv-heads and --window values.
// Invariants: an accepted descriptor gives a config model_validate_config accepts, whose
// parameter count does not overflow (stays below 2^48, what the limits of model_validate_config allow).
#include <string>
#include "llmc/train_config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string input((const char*)data, size);
    const size_t nul = input.find('\0');
    const std::string desc = input.substr(0, nul);
    TrainConfig cfg;
    if (nul != std::string::npos && nul + 2 < size) {
        cfg.kv_heads = data[nul + 1];
        cfg.window = data[nul + 2];
    }
    try {
        ModelConfig c = model_config_from_descriptor(desc.c_str());
        model_validate_config(c, "fuzz");
        const size_t n = model_num_params(c);
        FUZZ_CHECK(n > 0 && n < ((size_t)1 << 48));  // validation's largest, L 1024 x C 65536 x SwiGLU 2^21: ~2^47.6
        apply_shape_flags(c, cfg, true, desc.c_str());
        FUZZ_CHECK(c.num_heads % c.num_kv_heads == 0);
    } catch (const FailError&) {
    }
    return 0;
}
