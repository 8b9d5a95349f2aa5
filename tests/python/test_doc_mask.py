"""Document masking (--doc-mask 1, --doc-positions; docs/training.md, "Document masking"): build/train_gpt2_cpu
(fp32) against scripts/train_gpt2.py (float64, an explicit block-diagonal causal SDPA mask, position ids
restarting per document) on one B x T window of packed documents with a loss mask: documents of 1 to 7
tokens, a row that starts inside a document, two adjacent document tokens.
- one step at lr 10 with beta1 = beta2 = 0, eps 0.1, no decay and no clipping moves every weight by
  10 g / (|g| + 0.1), so each gradient g is read back from the weights: GPT-2 (MHA) and Llama (GQA), with
  and without a window, positions continue and restart; the step's loss (the masked mean) to LOSS_RTOL,
  every gradient tensor to GRAD_TOL of its largest entry; the same batch without --doc-mask gives other
  gradients (the mask is used). With RoPE, restarting positions changes only the rounding: a score
  depends on the distance between two positions, which the restart keeps;
- rows that each hold one document give the bits of --doc-mask 0 (losses and checkpoint), positions
  continue or restart;
- a row A|B under --doc-mask 1 --doc-positions restart gives B's targets the loss of B alone at the start
  of a row (CPU trainer, loss mask on B's targets), and in the reference B's logits (to 1e-12, float64);
- a loss mask that keeps nothing: loss 0, no NaN, as without document masking.
Measured (x86-64, 2 threads): the step's loss equal in the printed digits, gradients within 6.7e-7 (GPT-2)
and 1.3e-6 (Llama) of each tensor's scale; without --doc-mask they move by 0.7 to 1.5 of it.
Run: python3 -m pytest -q -s tests/python/test_doc_mask.py"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trajectory import (B, LOSS_RTOL, T, TRAINER, V, WEIGHT_ATOL, compare, cpu_trainer, fmt, reference,  # noqa: E402
                        train_gpt2, write_model)

DOC = V - 1        # the document token of these tests; the random tokens lie below it
GRAD_TOL = 1e-5    # max |ours - ref| / max |ref| per gradient tensor (test_gpt2_cpu's TOL_SCALED)
# One AdamW step with beta1 = beta2 = 0 moves a weight by LR g / (|g| + EPS): the gradient g read back from
# the weights. EPS balances the weights' fp32 rounding (small g) against the update's (large g).
LR, EPS = 10.0, 0.1
ONE_STEP = ["--steps", "1", "--warmup", "0", "--schedule", "constant", "--lr", str(LR), "--beta1", "0",
            "--beta2", "0", "--eps", str(EPS), "--grad-clip", "0"]
NO_DECAY = {"cpu": ["--wd", "0"], "ref": ["--weight-decay", "0"]}


def doc_flags(positions, token=DOC):
    return ["--doc-mask", "1", "--doc-positions", positions, "--doc-token", str(token)]


def packed_window():
    """B*T+1 tokens: row 0 has documents at 0, 5, 11; row 1 starts inside one and has documents at
    7 and 8 (one token long) and 14. The loss mask keeps about half the targets."""
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, DOC, B * T + 1)
    tokens[[0, 5, 11, T + 7, T + 8, T + 14]] = DOC
    mask = (rng.random(B * T + 1) < 0.5).astype(np.uint8)
    mask[1:4] = 1
    return tokens, mask


@pytest.fixture
def trainer():
    if not TRAINER.exists():
        pytest.skip(f"{TRAINER} is not built (make build/train_gpt2_cpu)")


def shard(tmp_path, name, tokens, mask=None):
    path = tmp_path / name
    fmt.write_shard(str(path), tokens, V, mask=mask)
    return path


def gradients(model, weights):
    """Each tensor's gradient from the weights after ONE_STEP: w1 = w0 - LR g / (|g| + EPS)."""
    cfg, w0 = fmt.read_model(str(model))
    x = (np.asarray(w0, dtype=np.float64) - weights) / LR
    g, out, off = EPS * x / (1 - np.abs(x)), {}, 0
    for name, shape in zip(fmt.PARAM_NAMES, fmt.param_shapes(cfg)):
        n = int(np.prod(shape))
        if n:
            out[name] = g[off:off + n]
        off += n
    return out


def grad_error(ref, got):
    return max(float(np.abs(got[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-30)) for k in ref)


@pytest.mark.parametrize("positions", ["continue", "restart"])
@pytest.mark.parametrize("window", [0, 4])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_one_step_gradients_match_the_reference(tmp_path, capsys, trainer, arch, window, positions):
    model = write_model(tmp_path, arch, ["--window", str(window)])
    path = shard(tmp_path, "packed.bin", *packed_window())
    flags = ONE_STEP + doc_flags(positions)
    ref = reference(model, path, capsys, flags + NO_DECAY["ref"])
    got = cpu_trainer(model, path, tmp_path / "run", flags + NO_DECAY["cpu"], steps=1)
    loss_rel = abs(ref[0][0] - got[0][0]) / ref[0][0]
    g_ref = gradients(model, ref[1])
    err = grad_error(g_ref, gradients(model, got[1]))
    with capsys.disabled():
        print(f"\n{arch} window {window} {positions}: loss {ref[0][0]:.6f} relative difference {loss_rel:.1e}, "
              f"gradients within {err:.2e} of each tensor's scale (tolerance {GRAD_TOL:g})")
    assert loss_rel < LOSS_RTOL and err < GRAD_TOL, (loss_rel, err)
    if positions == "continue":  # without --doc-mask the gradients are other ones
        plain = cpu_trainer(model, path, tmp_path / "plain", ONE_STEP + NO_DECAY["cpu"], steps=1)
        assert grad_error(g_ref, gradients(model, plain[1])) > 100 * GRAD_TOL


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_one_document_per_row_is_no_masking_bit_for_bit(tmp_path, trainer, arch):
    model = write_model(tmp_path, arch, ["--window", "4"] if arch == "llama" else [])
    tokens, mask = packed_window()
    tokens[tokens == DOC] = 0
    tokens[[0, T]] = DOC  # each row opens its document
    path = shard(tmp_path, "rows.bin", tokens, mask)
    runs = {}
    for name, flags in (("plain", []), ("continue", doc_flags("continue")), ("restart", doc_flags("restart"))):
        runs[name] = cpu_trainer(model, path, tmp_path / name, ["--steps", "3"] + flags, steps=3)
        runs[name] += ((tmp_path / name / "step_00000003" / "model.bin").read_bytes(),)
    assert runs["plain"][0] == runs["continue"][0] == runs["restart"][0]
    assert runs["plain"][2] == runs["continue"][2] == runs["restart"][2]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_document_after_another_is_the_document_alone(tmp_path, capsys, trainer, arch):
    """Row 0 = A (6 tokens) | B (10 tokens), B's targets kept (the last one: the next document's token);
    alone, B opens row 0 and a document token follows it. Restarting positions, B's loss is the same."""
    model = write_model(tmp_path, arch)
    rng = np.random.default_rng(12)
    a, b = rng.integers(0, DOC, 6), rng.integers(0, DOC, 10)
    a[0] = b[0] = DOC
    rest = rng.integers(0, DOC, B * T + 1 - T)
    rest[0] = DOC
    packed = np.concatenate([a, b, rest])
    alone = np.concatenate([b, [DOC], rng.integers(0, DOC, B * T - 10)])
    keep = lambda start: np.isin(np.arange(B * T + 1), np.arange(start + 1, start + 11)).astype(np.uint8)  # noqa: E731
    flags = ["--steps", "1"] + doc_flags("restart")
    got_packed = cpu_trainer(model, shard(tmp_path, "packed.bin", packed, keep(6)), tmp_path / "p", flags, steps=1)
    got_alone = cpu_trainer(model, shard(tmp_path, "alone.bin", alone, keep(0)), tmp_path / "a", flags, steps=1)
    assert got_packed[0] == got_alone[0], (got_packed[0], got_alone[0])
    # the reference: B's logits inside the packed row are B's logits alone
    args = train_gpt2.parse_args(["--load", str(model), "--train", "unused", *doc_flags("restart")])
    m = train_gpt2.build_model(args).double()
    m.docs = train_gpt2.doc_masking(m.cfg, args)
    with torch.no_grad():
        in_row = m(torch.from_numpy(packed[:T].astype(np.int64))[None])[0][0, 6:]
        by_itself = m(torch.from_numpy(b.astype(np.int64))[None])[0][0]
        m.docs = None
        unmasked = m(torch.from_numpy(packed[:T].astype(np.int64))[None])[0][0, 6:]
    assert (in_row - by_itself).abs().max() < 1e-12  # float64, other shapes: other summation orders
    assert (unmasked - by_itself).abs().max() > 1e-3


def test_a_mask_that_keeps_nothing_gives_loss_zero(tmp_path, capsys, trainer):
    model = write_model(tmp_path, "llama")
    tokens, _ = packed_window()
    path = shard(tmp_path, "none.bin", tokens, np.zeros_like(tokens))
    flags = ["--steps", "2"] + doc_flags("restart")
    ref = reference(model, path, capsys, flags)
    got = cpu_trainer(model, path, tmp_path / "run", flags, steps=2)
    assert ref[0] == [0.0, 0.0] and got[0] == [0.0, 0.0], (ref[0], got[0])
    assert compare(ref, got, steps=2)[1] < WEIGHT_ATOL
