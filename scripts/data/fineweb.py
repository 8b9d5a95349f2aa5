"""FineWeb or FineWeb-Edu (a sample of 10B, 100B or 350B GPT-2 tokens) as token shards.

    python3 scripts/data/fineweb.py [--edu] [--sample 10BT] [--source FILE_OR_FOLDER] [--out-dir data]

Writes data/fineweb10B/fineweb_val_000000.bin (the first shard is the validation set),
fineweb_train_000001.bin, ... and data/gpt2_tokenizer.bin; edu_fineweb10B/edu_fineweb_* with --edu;
the folder drops the size (data/fineweb/) when the documents come from a local source, and gets
the tokenizer's name (data/fineweb10B_DIR/, data/DIR_tokenizer.bin) with --tokenizer DIR/tokenizer.json.
Each document is preceded by an <|endoftext|> token; shards hold exactly --shard-size tokens
(default 100M, 200 MB; the last may be shorter), so a document can continue into the next shard.
Resumable: rerun the same command after an interruption and it continues after the last finished
shard, skipping the documents already written (see the *_progress.json in the output folder).

Sources: the Hugging Face datasets HuggingFaceFW/fineweb[-edu], config sample-<N>BT (streamed, needs
`pip install datasets`), or --source a .parquet/.jsonl with a "text" field (the hub's own files),
a .txt with documents separated by lines holding only <|endoftext|>, or a folder of such files
(sorted by name). With LLMC_OFFLINE_DATA set, $LLMC_OFFLINE_DATA/fineweb[.txt|.jsonl|.json|.parquet] is used
(a file or folder), with --edu $LLMC_OFFLINE_DATA/edu_fineweb[.txt|.jsonl|.json|.parquet].
"""
import argparse

from common import (add_common_args, add_shard_args, add_tokenizer_args, check_shard_args, dataset_dir, documents_from,
                    prepare_out_dir, run_main, tokenizer_from_args, write_sharded, write_tokenizer_table)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, "a local file or folder of documents (default: stream from the Hugging Face hub)")
    add_tokenizer_args(ap)
    add_shard_args(ap, 100_000_000)
    ap.add_argument("--edu", action="store_true", help="FineWeb-Edu instead of FineWeb")
    ap.add_argument("--sample", default="10BT", choices=["10BT", "100BT", "350BT"], help="hub sample (default 10BT)")
    args = ap.parse_args()
    # the flags, the source and the tokenizer are checked before anything is written
    check_shard_args(args.shard_size, args.workers, args.max_shards)
    name = "edu_fineweb" if args.edu else "fineweb"
    repo = "HuggingFaceFW/fineweb-edu" if args.edu else "HuggingFaceFW/fineweb"
    documents, desc = documents_from(args, repo, f"sample-{args.sample}", name)
    tok = tokenizer_from_args(args, load=True)
    prepare_out_dir(args.out_dir)
    write_tokenizer_table(tok, args.out_dir)
    from_hub = desc.startswith("hf:")  # a local source is no sample: its folder drops the size
    out = dataset_dir(args.out_dir, name + args.sample[:-1] if from_hub else name, tok)
    write_sharded(documents, out, name, args.shard_size, desc, tok, args.workers, args.max_shards)


if __name__ == "__main__":
    run_main(main)
