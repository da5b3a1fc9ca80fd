"""`depthlab data prepare` and `depthlab data info`."""

from __future__ import annotations

import json
import sys

from depthlab.flags import at_least, positive, share

PREPARE_HELP = """Tokenize text once into memory-mappable token files (train.bin, val.bin), tokenizer.json and
index.json. Inputs: text files, folders, globs, .jsonl/.json(.gz) (C4's format), .parquet, hf:PATH[:CONFIG[:SPLIT]]
(Hugging Face datasets); none: the built-in corpus. Rerunning after an interruption finishes the missing units
only; rerunning a finished job does nothing. Pass the output directory to `depthlab train --data DIR`."""
BUILTIN_MB, VOCAB_SIZE = 4.0, 32000


def cmd_prepare(args) -> None:
    from depthlab import UserError
    from depthlab.data.prepare import prepare
    from depthlab.ownership import input_paths, refuse_own_input

    # what it reads, before --out is locked, claimed or (with --overwrite) emptied
    refuse_own_input(args.out, [*input_paths(args.inputs), *([args.tokenizer] if args.tokenizer else [])],
                     "data prepare")
    if args.inputs and args.builtin_mb != BUILTIN_MB:
        raise UserError("--builtin-mb sizes the built-in corpus, which is read only when no INPUT is given; drop it")
    if args.tokenizer and args.vocab_size != VOCAB_SIZE:
        raise UserError("--vocab-size is the size of a BPE trained here; with --tokenizer the vocabulary is the "
                        "tokenizer's: drop one of them")
    index = prepare(args.inputs, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                    text_field=args.text_field, val_fraction=args.val_fraction, workers=args.workers,
                    fatal_bad_files=args.fatal_bad_files, streaming=args.streaming, builtin_mb=args.builtin_mb,
                    tokenizer_sample_mb=args.tokenizer_sample_mb, unit_mb=args.unit_mb,
                    progress=not args.no_progress, overwrite=args.overwrite, held_out=args.held_out or "balanced",
                    check=args.held_out == "balanced")
    print_info(args.out, index)


def print_info(path, index: dict) -> None:
    t, v = index["splits"]["train"], index["splits"]["val"]
    print(f"{path}: {index['source']}")
    print(f"train {t['documents']} documents, {t['tokens']} tokens; validation {v['documents']} documents, "
          f"{v['tokens']} tokens")
    print(f"tokenizer {index['tokenizer_hash']}, vocabulary {index['vocab_size']}, {index['dtype']} tokens")
    if "generated" in index:  # the balanced rule; data prepared before issue 50 held out by the alternate one
        print(f"held out by the balanced rule; {index['generated']} generated file(s) kept out of validation")
    if comp := v.get("composition"):  # data prepared before issue 50 has none
        from depthlab.data.tokens import MAX_SHARE, MIN_EFFECTIVE, describe_composition

        print(describe_composition("validation make-up", comp))
        if comp["effective"] < MIN_EFFECTIVE or comp["max_share"] > MAX_SHARE:
            print(f"warning: a validation split of fewer than {MIN_EFFECTIVE:g} effective documents, or with one "
                  f"over {MAX_SHARE:.0%} of it, measures those documents more than the corpus; hold out more "
                  "documents (--val-fraction) or give more text", file=sys.stderr)


def cmd_info(args) -> None:
    from depthlab.data.prepared import load_prepared

    index, _, _ = load_prepared(args.path)
    if args.json:
        print(json.dumps({k: v for k, v in index.items() if k != "request"}, indent=1))
    else:
        print_info(args.path, index)


def cmd_dedup(args) -> None:
    from pathlib import Path

    from depthlab.data.dedup import dedup_files, is_dedup_output
    from depthlab.ownership import input_paths, writing_files

    # never one of its inputs nor inside one (the next `prepare` of that folder would read the copies twice);
    # written whole: a crash or a bad input leaves an earlier file as it was
    with writing_files([Path(args.out)], is_dedup_output, "data dedup", args.overwrite,
                       input_paths(args.inputs)) as (tmp,):
        r = dedup_files(args.inputs, tmp, args.threshold, args.text_field)
    print(f"{args.out}: kept {r.kept} documents; removed {len(r.exact)} exact and {len(r.near)} near copies")
    for name, original in r.exact:
        print(f"  {name} (copies {original})")
    for name, original, similarity in r.near:
        print(f"  {name} (near copy of {original}, estimated similarity {similarity:.3f})")


def add_commands(sub) -> None:
    from depthlab.ownership import INPUT, OUTPUT

    d = sub.add_parser("data", help="prepare token data", description="Prepare and inspect token data.")
    dsub = d.add_subparsers(dest="data_command", metavar="COMMAND", required=True)

    p = dsub.add_parser("prepare", help="tokenize text into token files", description=PREPARE_HELP)
    p.add_argument("inputs", nargs="*", type=INPUT, metavar="INPUT", help="files, folders, globs or hf: specs")
    p.add_argument("--out", required=True, type=OUTPUT, help="output directory (locked while the job runs; an "
                   "existing one must "
                   "hold prepared data)")
    p.add_argument("--overwrite", action="store_true", help="replace --out even if it holds other files or data "
                   "prepared from other inputs")
    p.add_argument("--tokenizer", type=INPUT, help="a tokenizer.json or a transformers tokenizer directory (default: "
                   "train "
                   "byte-level BPE on the data)")
    p.add_argument("--vocab-size", type=at_least(257), default=VOCAB_SIZE,
                   help="vocabulary of the trained BPE (default 32000, at least 257)")
    p.add_argument("--text-field", type=str, default="text", help="JSON / parquet / hf field holding the text "
                   "(default text)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="documents held out for validation")
    p.add_argument("--held-out", choices=("balanced", "alternate"), help="how documents are held out: balanced "
                   "(default; generated files never, a held-out document at most 4 chunks of 2,000 characters "
                   "spread over it, fewer past 5%% of the split; given explicitly, a split of Kish effective "
                   "documents < 30 or one document over 10%% is refused, not warned about) or alternate (every "
                   "1/val-fraction-th document whole, as before issue 50)")
    p.add_argument("--workers", type=at_least(0), default=0, help="worker processes (default: one per CPU core)")
    p.add_argument("--fatal-bad-files", action="store_true", help="fail on an empty, binary or non-UTF-8 file "
                   "instead of skipping it")
    p.add_argument("--streaming", action="store_true", help="stream hf: datasets instead of downloading them")
    p.add_argument("--builtin-mb", type=positive, default=BUILTIN_MB,
                   help="built-in corpus size when no INPUT is given")
    p.add_argument("--tokenizer-sample-mb", type=positive, default=200.0, help="text used to train the BPE")
    p.add_argument("--unit-mb", type=positive, help="input MB per unit of work (default: automatic; inputs under "
                   "16 MB run in one process)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)

    u = dsub.add_parser("dedup", help="drop exact and near-duplicate documents (MinHash), write the rest as JSONL")
    u.add_argument("inputs", nargs="*", type=INPUT, metavar="INPUT", help="what `prepare` reads (none: the "
                   "built-in corpus)")
    u.add_argument("--out", required=True, type=OUTPUT, help="a .jsonl file of the kept documents, for `data "
                   "prepare`: new, or "
                   "an earlier dedup's (never inside an INPUT folder)")
    u.add_argument("--overwrite", action="store_true", help="replace --out even if it is not an earlier dedup's file")
    u.add_argument("--threshold", type=share, default=0.8, help="estimated Jaccard similarity of word 5-grams "
                   "at which two documents are copies, above 0 and at most 1 (default 0.8)")
    u.add_argument("--text-field", type=str, default="text", help="JSON / parquet / hf field holding the text")
    u.set_defaults(func=cmd_dedup)

    i = dsub.add_parser("info", help="describe a prepared-data directory")
    i.add_argument("path", type=INPUT)
    i.add_argument("--json", action="store_true", help="the whole index as JSON")
    i.set_defaults(func=cmd_info)
