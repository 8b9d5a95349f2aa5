"""A program compiles only what it runs: generate.cu's include closure (every `#include "..."` line
followed recursively, in both styles: "llmc/x.cuh" from the repository root and "x.cuh" beside the
including file) holds no backward, optimizer, FP8-training, training-step graph or data-parallel
header, and none of the trainers' program code (checkpoint writers, run files, flags). The walk
follows #include lines whatever #if surrounds them, so an include behind a build option counts too.
A made-up tree checks that the walk finds a forbidden header two levels down."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# header -> why generate must not compile it
TRAINING_ONLY = {
    "llmc/model_train.cuh": "the training layer (activations for backward, backward, update, checkpoints)",
    "llmc/attention.cuh": "the attention backward (the forward is llmc/attention_forward.cuh)",
    "llmc/attention_mma_backward.cuh": "the attention backward",
    "llmc/attention_hopper_backward.cuh": "the attention backward",
    "llmc/adamw.cuh": "the optimizer",
    "llmc/muon.cuh": "the Muon optimizer",
    "llmc/global_norm.cuh": "the gradient norm of the optimizer step",
    "llmc/model_fp8.cuh": "FP8 training",
    "llmc/fp8_fused.cuh": "FP8 training's fused casts",
    "llmc/model_graph.cuh": "the training step as a CUDA graph",
    "llmc/model_dist.cuh": "data-parallel training",
}
# the trainers' program code: generate reads checkpoints (--model takes a checkpoint directory) through
# llmc/checkpoint_read.h alone
PROGRAM_ONLY = {
    "llmc/checkpoint.h": "the trainer's checkpoint writers",
    "llmc/run_files.h": "the trainer's run files (--resume, --out-dir, --log)",
    "llmc/train_config.h": "the trainer's flags",
}


def include_closure(root, start):
    """Paths (relative to root, '/'-separated) of every file `start` includes, directly or not."""
    root = pathlib.Path(root)
    seen, todo = set(), [root / start]
    while todo:
        path = todo.pop()
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            for candidate in (path.parent / name, root / name):
                if candidate.is_file():
                    rel = candidate.resolve().relative_to(root.resolve()).as_posix()
                    if rel not in seen:
                        seen.add(rel)
                        todo.append(candidate)
                    break
    return seen


def found(root, start, banned):
    return sorted(h for h in include_closure(root, start) if h in banned)


def test_banned_headers_exist():
    # a renamed header would make the check below pass vacuously
    missing = [h for h in {**TRAINING_ONLY, **PROGRAM_ONLY} if not (ROOT / h).is_file()]
    assert not missing, f"these headers no longer exist, update the lists: {missing}"
    # and the trainer does reach them, so the walk sees what a compiler sees
    assert set(TRAINING_ONLY) | set(PROGRAM_ONLY) <= include_closure(ROOT, "train_gpt2.cu")


def test_generate_compiles_no_training():
    bad = found(ROOT, "generate.cu", TRAINING_ONLY)
    assert not bad, "generate.cu's includes reach training code: " + "; ".join(
        f"{h} ({TRAINING_ONLY[h]})" for h in bad)


def test_generate_compiles_no_trainer_program_code():
    bad = found(ROOT, "generate.cu", PROGRAM_ONLY)
    assert not bad, "generate.cu's includes reach the trainer's program code: " + "; ".join(
        f"{h} ({PROGRAM_ONLY[h]})" for h in bad)


def test_walk_finds_a_banned_header_two_levels_down(tmp_path):
    (tmp_path / "llmc").mkdir()
    (tmp_path / "generate.cu").write_text('#include <vector>\n#include "llmc/model.cuh"\n')
    (tmp_path / "llmc/model.cuh").write_text('#pragma once\n#if defined(X)\n#include "kernels.cuh"\n#endif\n')
    (tmp_path / "llmc/kernels.cuh").write_text('#include "llmc/adamw.cuh"\n#include "absent.h"\n')
    (tmp_path / "llmc/adamw.cuh").write_text("// the optimizer\n")
    assert found(tmp_path, "generate.cu", TRAINING_ONLY) == ["llmc/adamw.cuh"]
