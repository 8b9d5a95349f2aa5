#!/usr/bin/env bash
# Slurm: GPT-2 124M data parallel on 2 nodes x 8 GPUs, one process per GPU (docs/distributed.md).
#   sbatch scripts/sbatch_train_gpt2.sh
# Every task is one rank: srun sets SLURM_PROCID (the rank), SLURM_STEP_NUM_TASKS (the world size) and
# SLURM_LOCALID (its GPU on the node); the ranks meet at rank 0's node, the first of the job, by
# --dist-init tcp://HOST:PORT. Checkpoints go to --out-dir, which every node must see (a shared
# filesystem): each rank writes its optimizer shard there. With an MPI build
# (make build/train_gpt2cu_mpi) use `srun --mpi=pmix build/train_gpt2cu_mpi ...` and no --dist-init.
#SBATCH --job-name=llmc-d12
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=log/%x-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
PORT=${PORT:-$((20000 + SLURM_JOB_ID % 20000))}  # one port per job, so two jobs on a node do not meet
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-8}
# 16 ranks x 64 x 1024 tokens = 1M tokens per micro-batch step; --total-batch 1048576 needs no accumulation
srun --kill-on-bad-exit=1 build/train_gpt2cu_nccl --dist-init "tcp://$MASTER:$PORT" --dist-timeout 900 --zero 1 \
    --train "data/fineweb10B/*train*.bin" --val "data/fineweb10B/*val*.bin" --tokenizer data/gpt2_tokenizer.bin \
    --init d12 --batch 64 --seq 1024 --total-batch 1048576 --lr 1.2e-3 --warmup 350 --steps 9500 \
    --val-every 250 --sample-every 1000 --ckpt-every 1000 --out-dir out/d12_slurm --log out/d12_slurm/log.txt
