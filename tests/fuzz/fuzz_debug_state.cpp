// fuzz_debug_state: the debug state reader of the tests (GPTX, debug_state_read in
// llmc/formats.h) for the small model whose seed tests/fuzz/make_seeds.py writes (TINY there).
// Invariants: an accepted file's arrays have the sizes its header gives, and every input and
// target id is below the model's vocab_size.
#include "llmc/formats.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("debug.bin");
    const char* path = file.set(data, size);
    ModelConfig c;
    c.max_seq_len = 4; c.vocab_size = 8; c.padded_vocab_size = 8; c.num_layers = 1;
    c.num_heads = 2; c.num_kv_heads = 1; c.channels = 4; c.window = 0;
    try {
        DebugState d = debug_state_read(path, c);
        const size_t BT = (size_t)d.B * d.T;
        FUZZ_CHECK(d.inputs.size() == BT && d.targets.size() == BT && d.logits.size() == BT * d.V);
        FUZZ_CHECK(d.grads.size() == model_num_params(c) && (int)d.losses.size() == d.num_steps);
        for (size_t i = 0; i < BT; i++) FUZZ_CHECK(d.inputs[i] >= 0 && d.inputs[i] < c.vocab_size);
    } catch (const FailError&) {
    }
    return 0;
}
