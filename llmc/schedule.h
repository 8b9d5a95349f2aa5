// schedule.h: the learning-rate schedule shared by both trainers (docs/design.md).
// Steps are 0-based. Warmup: lr * (step + 1) / warmup for step < warmup. After it, over the
// remaining steps, one of
//   cosine    lr_min + (lr - lr_min) * 0.5 * (1 + cos(pi * progress))
//   linear    lr - (lr - lr_min) * progress
//   constant  lr
//   wsd       lr until the last cooldown_frac * total_steps steps, then linear down to lr_min
// with lr_min = lr * final_lr_frac and progress = (step - start) / (length of the phase), so the
// last step still trains (at a learning rate just above lr_min) as in nanoGPT and llm.c.
#pragma once
#include <cmath>
#include <cstring>

enum class LrScheduleKind { Cosine, Linear, Constant, Wsd };

struct LrSchedule {
    LrScheduleKind kind = LrScheduleKind::Cosine;
    float lr = 6e-4f;
    int warmup = 0;             // steps
    int total_steps = 1;        // the run's length; the decay ends here
    float final_lr_frac = 0.0f; // lr_min = lr * final_lr_frac
    float cooldown_frac = 0.2f; // wsd only: fraction of total_steps spent cooling down
};

// Parses a schedule name; false if unknown (the caller reports the flag).
inline bool lr_schedule_from_name(const char* name, LrScheduleKind* out) {
    static const struct { const char* name; LrScheduleKind kind; } kinds[] = {
        {"cosine", LrScheduleKind::Cosine}, {"linear", LrScheduleKind::Linear},
        {"constant", LrScheduleKind::Constant}, {"wsd", LrScheduleKind::Wsd}};
    for (const auto& k : kinds)
        if (strcmp(name, k.name) == 0) { *out = k.kind; return true; }
    return false;
}

inline float lr_at_step(const LrSchedule& s, int step) {
    if (step < s.warmup) return s.lr * (float)(step + 1) / (float)s.warmup;
    const float lr_min = s.lr * s.final_lr_frac;
    if (s.kind == LrScheduleKind::Constant) return s.lr;
    if (s.kind == LrScheduleKind::Wsd) {
        const int cooldown = (int)lroundf(s.cooldown_frac * s.total_steps);
        const int start = s.total_steps - cooldown;
        if (step < start || cooldown <= 0) return s.lr;
        const float progress = (float)(step - start) / (float)cooldown;
        return s.lr - (s.lr - lr_min) * (progress > 1.0f ? 1.0f : progress);
    }
    const int decay_steps = s.total_steps - s.warmup;
    float progress = decay_steps > 0 ? (float)(step - s.warmup) / (float)decay_steps : 1.0f;
    if (progress > 1.0f) progress = 1.0f;
    if (s.kind == LrScheduleKind::Linear) return s.lr - (s.lr - lr_min) * progress;
    return lr_min + (s.lr - lr_min) * 0.5f * (1.0f + cosf((float)M_PI * progress));
}
