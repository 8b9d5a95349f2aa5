"""TinyStories (~2.1M short stories written by GPT-3.5/4, ~470M GPT-2 tokens) as token shards.

    python3 scripts/data/tinystories.py [--source FILE_OR_FOLDER] [--out-dir data] [--shard-size N]

Writes data/tinystories/tinystories_val_000000.bin (the first shard is the validation set),
tinystories_train_000001.bin, ... and data/gpt2_tokenizer.bin (--tokenizer DIR/tokenizer.json:
data/tinystories_DIR/ and data/DIR_tokenizer.bin; see tinyshakespeare.py). Each story is preceded by an
<|endoftext|> token; shards hold exactly --shard-size tokens (the last may be shorter), so a story
can continue into the next shard. Resumable: rerun the same command after an interruption and
it continues after the last finished shard (see data/tinystories/tinystories_progress.json).

Sources: the Hugging Face dataset roneneldan/TinyStories (streamed, needs `pip install datasets`),
or --source a .txt file with stories separated by lines holding only <|endoftext|> (the
TinyStoriesV2-GPT4-*.txt files), a .jsonl/.parquet with a "text" field, a .json list of objects
(TinyStories_all_data/*.json: use --text-field story), or a folder of such files (sorted by name).
With LLMC_OFFLINE_DATA set, $LLMC_OFFLINE_DATA/tinystories[.txt|.jsonl|.json|.parquet] is used.
"""
import argparse

from common import (add_common_args, add_shard_args, add_tokenizer_args, check_shard_args, dataset_dir, documents_from,
                    prepare_out_dir, run_main, tokenizer_from_args, write_sharded, write_tokenizer_table)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, "a local file or folder of stories (default: stream from the Hugging Face hub)")
    add_tokenizer_args(ap)
    add_shard_args(ap, 10_000_000)
    args = ap.parse_args()
    # the flags, the source and the tokenizer are checked before anything is written
    check_shard_args(args.shard_size, args.workers, args.max_shards)
    documents, desc = documents_from(args, "roneneldan/TinyStories", None, "tinystories")
    tok = tokenizer_from_args(args, load=True)
    prepare_out_dir(args.out_dir)
    write_tokenizer_table(tok, args.out_dir)
    write_sharded(documents, dataset_dir(args.out_dir, "tinystories", tok), "tinystories", args.shard_size, desc,
                  tok, args.workers, args.max_shards)


if __name__ == "__main__":
    run_main(main)
