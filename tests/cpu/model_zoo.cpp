// model_zoo: one line per entry of llmc/model_config.h's MODEL_ZOO, the config --init NAME gives:
//   name arch L C NH NKV F V tied theta eps params rope_factor rope_low rope_high rope_orig
// tests/python/test_model_zoo.py compares each line with the published model's transformers config.
#include <cstdio>
#include "llmc/model_config.h"

int main() {
    for (const ZooModel& z : MODEL_ZOO) {
        const ModelConfig c = model_config_from_descriptor(z.name);
        const RopeScaling& r = c.rope_scaling;
        printf("%s %s %d %d %d %d %d %d %d %g %g %zu %g %g %g %d\n", z.name, model_arch_name(c), c.num_layers,
               c.channels, c.num_heads, c.num_kv_heads, model_mlp_hidden(c), c.vocab_size, c.tied_head,
               c.rope_theta, c.norm_eps, model_num_params(c), r.factor, r.low_freq_factor, r.high_freq_factor,
               r.original_max_pos);
    }
}
