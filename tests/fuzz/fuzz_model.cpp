// fuzz_model: the model checkpoint reader (GPTM, llmc/formats.h). Reads the header and length,
// then the parameters as fp32 (converting bf16 files), as both trainers do at --init FILE.
// Invariant: an accepted file's parameter count is what its shape implies, and its length is the
// header plus that many fp32 or bf16 values.
#include <vector>
#include "llmc/formats.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("model.bin");
    const char* path = file.set(data, size);
    try {
        ModelFileInfo info = model_read_info(path);
        FUZZ_CHECK((size_t)info.num_params == model_num_params(info.config));
        const int64_t bytes = info.dtype == DTYPE_BF16 ? 2 : 4;
        FUZZ_CHECK((int64_t)size == HEADER_BYTES + info.num_params * bytes);
        std::vector<float> params(info.num_params);
        model_read_fp32(path, params.data());
    } catch (const FailError&) {
    }
    return 0;
}
