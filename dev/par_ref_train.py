"""par_ref_train.py: scripts/train_gpt2.py's train mode with two additions for trainer-parity runs
(dev/bench/par_trainer_parity.sh):

  --order llmc   with --shuffle 1, read the windows in llmc/dataloader.h's exact order (world size 1):
                 per epoch a Fisher-Yates shuffle of the shards, then of each shard's windows, each from a
                 splitmix64 stream seeded by stream_seed(seed, epoch, stream), as the C++ loader draws them.
                 Default `ref`: the reference's own order (numpy default_rng([seed, epoch]) permutations).
  a norm line    `step n norm x` after each train step: the global gradient norm before clipping (what the
                 C++ trainers print as `norm`), nan when --grad-clip <= 0.
  --print-batches N  print the first N training batches of the chosen order instead of training, as
                 dev/par_loader_order.cpp prints llmc's: `batch k tokens t0 t1 t2 t3 sum`.

Every other flag goes to scripts/train_gpt2.py unchanged, e.g.
  python3 dev/par_ref_train.py --order llmc --load init.bin --train "d/*_train_*.bin" --steps 120 \
      --lr 6e-4 --schedule cosine --warmup 20 --shuffle 1 --seed 1337
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import train_gpt2 as ref  # noqa: E402

MASK64 = (1 << 64) - 1


class SplitMix64:
    """llmc/rand.h's Rng: the state advances by a constant, the output is its finalizer."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def shuffle(self, a):
        """rng_shuffle: Fisher-Yates from the last element down, j = next % (i + 1)."""
        for i in range(len(a) - 1, 0, -1):
            j = self.next_u64() % (i + 1)
            a[i], a[j] = a[j], a[i]
        return a


def stream_seed(seed, epoch, stream):
    """DataLoader::stream_seed: two splitmix64 rounds over (seed, epoch, stream)."""
    a = SplitMix64(seed ^ ((epoch * 0xD1B54A32D192ED03) & MASK64))
    return SplitMix64(a.next_u64() ^ ((stream * 0x8CB92BA72F3D8DD7) & MASK64)).next_u64()


def llmc_windows(pattern, B, T, V, flag, shuffle_seed=None):
    """The reference's shard_windows with llmc/dataloader.h's order (rank 0 of 1)."""
    if shuffle_seed is None:  # file order: the reference's and llmc's agree
        yield from ORIGINAL_SHARD_WINDOWS(pattern, B, T, V, flag, None)
        return
    paths = sorted(ref.glob.glob(pattern))
    if not paths:
        ref.die(f"{flag} '{pattern}': no token shards match")
    shards, masks = zip(*(ref.read_tokens(p, V, flag, with_mask=True) for p in paths))
    BT, epoch = B * T, 0
    while True:
        order = SplitMix64(stream_seed(shuffle_seed, epoch, MASK64)).shuffle(list(range(len(shards))))
        for s in order:
            n = (len(shards[s]) - 1) // BT
            for w in SplitMix64(stream_seed(shuffle_seed, epoch, s)).shuffle(list(range(n))):
                start = w * BT
                buf = torch.from_numpy(shards[s][start:start + BT + 1].astype(np.int64))
                y = buf[1:].clone()
                if masks[s] is not None:
                    y[torch.from_numpy(masks[s][start + 1:start + BT + 1] == 0)] = -100
                yield buf[:-1].view(B, T), y.view(B, T)
        epoch += 1


ORIGINAL_SHARD_WINDOWS = ref.shard_windows
ORIGINAL_TRAIN_STEP = ref.train_step


def take_flag(argv, flag, default):
    """The value of `flag VALUE` in argv (removed from it), or default."""
    if flag not in argv:
        return default
    i = argv.index(flag)
    if i + 1 == len(argv):
        ref.die(f"{flag}: needs a value")
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def main():
    argv = sys.argv[1:]
    order = take_flag(argv, "--order", "ref")
    print_batches = int(take_flag(argv, "--print-batches", "0"))
    if order not in ("ref", "llmc"):
        ref.die(f"--order {order}: not ref or llmc")
    if order == "llmc":
        ref.shard_windows = llmc_windows
    if print_batches:
        args = ref.parse_args(argv)
        batches = ref.shard_windows(args.train, args.batch, args.seq, 1 << 20, "--train",
                                    args.seed if args.shuffle else None)
        for k in range(print_batches):
            x = next(batches)[0].reshape(-1)
            print(f"batch {k} tokens {' '.join(str(int(t)) for t in x[:4])} {int(x.sum())}")
        return
    clip = torch.nn.utils.clip_grad_norm_
    norms = []

    def clip_and_record(*a, **k):
        norm = clip(*a, **k)
        norms.append(float(norm))
        return norm

    step = [0]

    def train_step(model, step_model, opt, x, y, args):
        norms.clear()
        loss = ORIGINAL_TRAIN_STEP(model, step_model, opt, x, y, args)
        step[0] += 1
        print(f"step {step[0]} norm {norms[0] if norms else float('nan'):.6f}", flush=True)
        return loss

    torch.nn.utils.clip_grad_norm_ = clip_and_record
    ref.train_step = train_step
    ref.main(argv)


if __name__ == "__main__":
    main()
