"""Every bad input a user can give: one `depthlab: error:` line, exit status 2, no traceback, nothing changed.

The table below is the adversarial sweep of issue 17 (every case it lists, and the ones that already behaved),
run in-process against one tiny world built once per module: a trained run, its export, prepared data, and the
odd files users pass by mistake. Each case gets a scratch directory; cases that would write into something
valuable get their own copy of it ("victims"). Before and after every case the world and the scratch directory
are checksummed: a bad input must change nothing. `python tests/test_bad_inputs.py` prints the outcome of every
case and the counts by outcome (clean, traceback, silent exit 0, data loss), for any version of depthlab on
PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

import pytest

TINY = ("--set model.dim=32 --set model.n_layers=2 --set model.n_heads=2 --set model.ffn_dim=64 "
        "--set model.vocab_size=300 --set model.max_seq_len=64 --set data.seq_len=32 --set train.batch_size=4 "
        "--set train.eval_every=2 --set train.log_every=1 --set train.warmup_steps=1 --set train.monitor_every=0 "
        "--no-progress --max-steps 2")
TRAIN = "train --data {txt} --run-dir {tmp}/r {T}"  # a fresh run that would finish in a second if it started
VIT = ("train --preset vit-digits --run-dir {tmp}/v --no-progress --max-steps 2 --set train.warmup_steps=1 "
       "--set model.dim=32 "
       "--set model.n_layers=2 --set model.n_heads=2 --set model.ffn_dim=64")
UNWRITABLE = "/sys/depthlab-test-out"  # EPERM even for root (the tests may run as root, where chmod does not bite)
AN = "--tokens 64 --no-removal --no-jacobian"
STUDY = ("benchmarks.depth_transfer run --runs-dir {study_runs} --corpus-mb 0.05 --vocab 300 --dim 32 --heads 2 "
         "--ffn 64 --seq 32 --batch 4 --eval-every 1 --probe-windows 4 --val-tokens 256 --variants pre --lrs 0.004 "
         "--depths 2 --base-depth 2 --grid-depths 2 --parts-depth 0 --seeds 0 --widen 0 --jobs 1")
COORD = "coord-check --data {txt} --depths 2 4 --seeds 1 --steps 1 --no-progress --out "
CONTINUE = "continue:{victim_docs}/README.md,n=1,words=1,answer=1"  # a task its 3 words can hold
LMEVAL = "lmeval --model depthlab --tasks depthlab_mc --include_path {task_answer_first} --device cpu --model_args "

# (id, command, fragment of the error line)
CASES = [
    # --- train: flags and config values
    ("train-unknown-scheme", TRAIN + " --scheme LNS", "unknown norm scheme"),
    ("train-unknown-preset", TRAIN + " --preset gpt5", "unknown preset"),
    ("train-unknown-key", TRAIN + " --set model.depth=3", "unknown config key"),
    ("train-heads-not-dividing", TRAIN + " --set model.n_heads=3", "does not divide"),
    ("train-set-without-equals", TRAIN + " --set nokey", "--set expects key=value"),
    ("train-set-bad-type", TRAIN + " --set model.dim=abc", "model.dim"),
    ("train-lr-negative", TRAIN + " --set train.lr=-1", "train.lr"),
    ("train-lr-nan", TRAIN + " --set train.lr=nan", "train.lr"),
    ("train-beta1-above-1", TRAIN + " --set train.beta1=1.5", "train.beta1"),
    ("train-threads-negative", TRAIN + " --set train.threads=-1", "train.threads"),
    ("train-dtype-fp16", TRAIN + " --set train.dtype=fp16", "train.dtype"),
    ("train-parallel-unknown", TRAIN + " --set train.parallel=tp", "train.parallel"),
    ("train-on-nonfinite-unknown", TRAIN + " --set train.on_nonfinite=ignore", "train.on_nonfinite"),
    ("train-optimizer-unknown", TRAIN + " --set train.optimizer=sgd", "train.optimizer must be adamw or muon"),
    ("train-muon-momentum-1", TRAIN + " --set train.optimizer=muon --set train.muon_momentum=1",
     "train.muon_momentum must be in [0, 1)"),
    ("train-keep-last-0", TRAIN + " --set train.keep_last=0", "keep_last"),
    ("train-seq-len-0", TRAIN + " --set data.seq_len=0", "data.seq_len"),
    ("train-seq-len-beyond-context", TRAIN + " --set data.seq_len=100000", "data.seq_len"),
    ("train-val-fraction", TRAIN + " --set data.val_fraction=1.5", "val_fraction"),
    ("train-unknown-init", TRAIN + " --set model.init=foo", "unknown init"),
    ("train-gpas-with-post", TRAIN + " --scheme post --set model.gpas=true", "gpas"),
    ("train-mixln-ratio", TRAIN + " --set model.mixln_ratio=2", "mixln_ratio"),
    # --- train: a switch without the setting it acts with (config.COMPANIONS: it would train the plain model)
    ("train-depth-base-without-alpha", TRAIN + " --set model.depth_base=6", "model.depth_base=6 has no effect"),
    ("train-gain-const-without-uniform", TRAIN + " --set model.norm_gain_const=0.3",
     "model.norm_gain_const=0.3 has no effect with model.norm_gain_init=1"),
    ("train-lns-power-with-pre", TRAIN + " --scheme pre --set model.lns_power=1", "model.lns_power=1.0 has no effect"),
    ("train-mixln-ratio-with-lns", TRAIN + " --set model.mixln_ratio=0.5", "acts only with model.norm_scheme=mixln"),
    ("train-gpas-gate-without-gpas", TRAIN + " --set model.gpas_gate=per_add", "acts only with model.gpas=true"),
    ("train-image-size-on-llama", TRAIN + " --set model.image_size=32", "acts only with model.family=vit"),
    ("train-builtin-mb-with-data", TRAIN + " --set data.builtin_mb=1", "data.builtin_mb=1.0 has no effect"),
    ("train-max-skips-without-skip", TRAIN + " --set train.max_skips=3", "acts only with train.on_nonfinite=skip"),
    ("train-muon-lr-without-muon", TRAIN + " --set train.muon_lr=0.01", "acts only with train.optimizer=muon"),
    ("train-lora-alpha-without-rank", TRAIN + " --set train.lora.alpha=16", "acts only with train.lora.rank set"),
    ("train-cuda-on-cpu", TRAIN + " --set train.device=cuda", "CUDA"),
    ("train-unknown-device", TRAIN + " --set train.device=tpu", "unknown device"),
    ("train-max-steps-negative", TRAIN + " --max-steps -1", "train.max_steps"),
    ("train-batch-size-0", TRAIN + " --set train.batch_size=0", "train.batch_size"),
    ("train-batch-size-huge", TRAIN + " --set train.batch_size=10000000000", "train.batch_size"),
    ("train-vocab-huge", TRAIN + " --set model.vocab_size=1000000000000", "model.vocab_size"),
    ("train-dim-huge", TRAIN + " --set model.dim=1000000000000 --set model.n_heads=1", "parameters"),
    ("train-grad-accum-0", TRAIN + " --set train.grad_accum=0", "train.grad_accum"),
    ("train-kv-heads", TRAIN + " --set model.n_kv_heads=3", "n_kv_heads"),
    ("train-warmup-negative", TRAIN + " --set train.warmup_steps=-1", "warmup_steps"),
    ("train-ckpt-every-negative", TRAIN + " --set train.ckpt_every=-1", "ckpt_every"),
    ("train-vocab-below-tokenizer", TRAIN + " --set model.vocab_size=100", "model.vocab_size"),
    ("train-max-steps-not-int", TRAIN + " --max-steps abc", "invalid int value"),
    ("train-unknown-flag", TRAIN + " --bogus", "unrecognized arguments"),
    # --- train: vision transformers
    ("vit-patch-not-dividing", VIT + " --set model.patch_size=3", "must divide"),
    ("vit-unknown-pool", VIT + " --set model.pool=max", "model.pool"),
    ("vit-unknown-positions", VIT + " --set model.pos_embed=rope", "model.pos_embed"),
    ("vit-lns-placement", VIT + " --set model.lns_placement=after", "lns_placement"),
    ("vit-too-few-classes", VIT + " --set model.num_classes=4", "10 classes"),
    ("vit-text-as-images", VIT + " --data {txt}", "must be a .npz"),
    ("vit-two-image-sources", VIT + " --data {txt} {txt}", "one"),
    ("vit-missing-images", VIT + " --data {tmp}/missing.npz", "missing.npz"),
    ("vit-billion-classes", VIT + " --data {npz_huge_label}", "1,000,000,001 classes"),
    # --- train: config files
    ("train-config-missing", TRAIN + " --config {tmp}/missing.yaml", "cannot read config"),
    ("train-config-and-preset", TRAIN + " --config {json_unknown} --preset llama-71m", "pass one of them"),
    ("train-config-yaml-syntax", TRAIN + " --config {yaml_bad}", "cannot read config"),
    ("train-config-yaml-list", TRAIN + " --config {yaml_list}", "must be a mapping"),
    ("train-config-unknown-key", TRAIN + " --config {json_unknown}", "unknown config key"),
    # --- train: data
    ("train-data-missing", TRAIN + " --data {tmp}/missing.txt", "does not exist"),
    ("train-data-empty", TRAIN + " --data {empty}", "no usable text"),
    ("train-data-binary", TRAIN + " --data {bin}", "binary"),
    ("train-data-latin1", TRAIN + " --data {latin1}", "not valid UTF-8"),
    ("train-data-latin1-fatal", TRAIN + " --data {latin1} --set data.fatal_bad_files=true", "UTF-8"),
    ("train-data-glob-no-match", TRAIN + " --data {tmp}/nomatch*.txt", "no files match"),
    ("train-data-bad-jsonl", TRAIN + " --data {badjsonl}", "not JSON"),
    ("train-data-deep-jsonl", TRAIN + " --data {deepjsonl}", "deepjsonl.jsonl:2: not JSON that a record can be"),
    ("train-data-jsonl-no-field", TRAIN + " --data {nofield}", "no 'text' field"),
    ("train-data-too-small", TRAIN + " --data {small}", "too small"),
    ("train-data-prepared-plus-raw", TRAIN + " --data {prep} {txt}", "one prepared-data directory"),
    ("train-data-hf-spec", TRAIN + " --data hf:", "expected hf:PATH"),
    ("train-tokenizer-missing", TRAIN + " --set data.tokenizer={tmp}/missing.json", "tokenizer"),
    ("train-oversized-line", TRAIN + " --data {bigline}", "MB"),
    # --- train: where it writes, what it resumes
    ("train-resume-auto-no-run-dir", "train --data {txt} --resume auto {T}", "--resume auto needs --run-dir"),
    ("train-resume-missing", TRAIN + " --resume {tmp}/missing", "does not exist"),
    ("train-resume-hf-dir", "train --resume {hf} {T}", "Hugging Face model directory"),
    ("train-resume-prepared", "train --resume {prep} {T}", "prepared-data directory"),
    ("train-resume-changed-config", "train --data {txt} --resume {run} {T} --set model.dim=64", "different config"),
    ("train-resume-auto-another-file", "train --data {txt_copy} --run-dir {victim} --resume auto {T}",
     "data.paths"),  # an identical copy is another file (the same file by another path resumes: test_trainer)
    ("train-resume-loose-checkpoint", "train --data {txt} --resume {loose} {T}", "--run-dir"),
    ("train-resume-all-corrupted", "train --data {txt} --resume {corrupt} {T}", "no valid checkpoint"),
    ("train-resume-imported", TRAIN + " --resume {imported}", "--init-from"),
    ("train-resume-several-runs", "train --data {txt} --resume {runs2} {T}", "holds 2 runs"),
    ("train-branch-into-other-run", "train --data {txt} --resume {ckpt} --run-dir {victim} {T}", "--overwrite"),
    ("train-run-dir-existing-run", "train --data {txt} --run-dir {victim} {T}", "already holds checkpoints"),
    ("train-run-dir-hf-export", "train --data {txt} --run-dir {victim_hf} {T}", "Hugging Face model directory"),
    ("train-run-dir-prepared", "train --data {txt} --run-dir {victim_prep} {T}", "prepared-data directory"),
    ("train-run-dir-file", "train --data {txt} --run-dir {txt_copy} {T}", "is a file"),
    ("train-run-dir-foreign", "train --data {txt} --run-dir {victim_foreign} {T}", "--overwrite"),
    ("train-run-dir-runs-parent", "train --data {txt} --run-dir {victim_runs} {T}", "directory of runs"),
    ("train-run-dir-unwritable", "train --data {txt} --run-dir " + UNWRITABLE + "/r {T}", "cannot write"),
    ("train-out-under-a-file", "train --data {txt} --out {txt}/runs {T}", "cannot write"),
    ("train-init-from-missing", TRAIN + " --init-from {tmp}/missing", "does not exist"),
    ("train-init-from-hf", TRAIN + " --init-from {hf}", "depthlab import"),
    ("train-init-from-other-shape", TRAIN + " --init-from {ckpt} --set model.dim=64", "cannot start from"),
    # --- eval
    ("eval-missing", "eval ppl {tmp}/missing", "does not exist"),
    ("eval-foreign-dir", "eval ppl {foreign}", "neither a checkpoint nor a run directory"),
    ("eval-empty-dir", "eval ppl {tmp}", "empty directory"),
    ("eval-a-file", "eval ppl {txt}", "is a file"),
    ("eval-prepared", "eval ppl {prep}", "prepared-data directory"),
    ("eval-several-runs", "eval ppl {runs2}", "holds 2 runs: a, b"),
    ("eval-analysis-folder", "eval ppl {analysis}", "analysis report"),
    ("eval-batch-size-0", "eval ppl {run} --batch-size 0", "--batch-size"),
    ("eval-batch-size-negative", "eval ppl {run} --batch-size -3", "--batch-size"),
    ("eval-batch-size-not-int", "eval ppl {run} --batch-size x", "invalid int value"),
    ("eval-seq-len-negative", "eval ppl {run} --seq-len -5", "--seq-len"),
    ("eval-seq-len-0", "eval ppl {run} --seq-len 0", "--seq-len"),
    ("eval-seq-len-beyond-context", "eval ppl {run} --seq-len 512", "context of 64"),
    ("eval-cuda-on-cpu", "eval ppl {run} --device cuda", "CUDA"),
    ("eval-unknown-device", "eval ppl {run} --device tpu", "unknown device"),
    ("eval-data-missing", "eval ppl {run} --data {tmp}/missing.txt", "does not exist"),
    ("eval-data-empty", "eval ppl {run} --data {empty}", "no usable text"),
    ("eval-data-binary", "eval ppl {run} --data {bin}", "no usable text"),
    ("eval-data-too-short", "eval ppl {run} --data {small}", "tokens"),
    ("eval-data-other-tokenizer", "eval ppl {run} --data {prep}", "prepared with tokenizer"),
    ("eval-corrupted-checkpoint", "eval ppl {corrupt_ckpt}", "corrupted checkpoint"),
    ("eval-all-corrupted-run", "eval ppl {corrupt}", "no valid checkpoint"),
    ("eval-hf-without-data", "eval ppl {hf}", "--data"),
    ("eval-hf-seq-len-beyond-context", "eval ppl {hf} --data {txt} --seq-len 512", "context of 64"),
    ("eval-tasks-missing", "eval tasks {run} --tasks {tmp}/missing.jsonl", "cannot read task file"),
    ("eval-tasks-malformed", "eval tasks {run} --tasks {tasks_bad}", "not JSON"),
    ("eval-tasks-hf-malformed", "eval tasks {hf} --tasks {tasks_bad}", "not JSON"),
    ("eval-tasks-on-prepared", "eval tasks {prep} --tasks {tasks}", "prepared-data directory"),
    ("eval-no-model", "eval", "required"),
    # --- eval --card: an export's model card, of the one model evaluated, checked before the evaluation
    ("eval-card-missing", "eval tasks {run} --tasks {tasks} --card {tmp}/missing", "missing does not exist"),
    ("eval-card-a-run", "eval tasks {run} --tasks {tasks} --card {run}", "is a depthlab run directory, not a "
     "`depthlab export`"),
    ("eval-card-users-hf", "eval tasks {run} --tasks {tasks} --card {victim_user_hf}",
     "not a `depthlab export` directory"),
    ("eval-card-of-another-model", "eval tasks {post} --tasks {tasks} --card {hf}",
     "give the card of the model evaluated"),
    ("eval-card-two-models", "eval commonsense {run} {run} --commonsense {commonsense} --card {hf}",
     "2 models are given"),
    ("eval-card-with-harness", "eval harness {run} --harness {task_answer_first} --card {hf}",
     "unrecognized arguments: --card"),
    ("finetune-deep-json", "finetune {run} --data {deep_json}", "nested too deeply"),
    # --- export
    ("export-missing", "export {tmp}/missing {tmp}/o", "does not exist"),
    ("export-hf-dir", "export {hf} {tmp}/o", "Hugging Face model directory"),
    ("export-prepared", "export {prep} {tmp}/o", "prepared-data directory"),
    ("export-several-runs", "export {runs2} {tmp}/o", "holds 2 runs"),
    ("export-all-corrupted", "export {corrupt} {tmp}/o", "no valid checkpoint"),
    ("export-refused-scheme", "export {post} {tmp}/o", "cannot export scheme 'post'"),
    ("export-onto-run", "export {run} {victim}", "run directory"),
    ("export-onto-file", "export {run} {txt}", "is a file"),
    ("export-under-a-file", "export {run} {txt}/o", "cannot write"),
    ("export-unwritable", "export {run} " + UNWRITABLE + "/o", "cannot write"),
    ("export-onto-foreign", "export {run} {victim_foreign}", "--overwrite"),
    ("export-onto-prepared", "export {run} {victim_prep}", "prepared-data directory"),
    ("export-onto-users-hf", "export {run} {victim_user_hf}", "--overwrite"),
    ("export-missing-out", "export {run}", "required"),
    # --- prune
    ("analyze-gguf-f64", "analyze {gguf_f64} --out {tmp}/o", "tensor type F64 cannot be dequantized"),
    ("import-gguf-f64", "import {gguf_f64} {tmp}/o", "tensor type F64 cannot be dequantized"),
    # issue 60: the study scripts' arguments, and a rerun whose settings are not those of the records it would reuse
    ("own-rate-depth-without-centre", "benchmarks.own_rate run --depths 7 --out {tmp}/o",
     "--depths 7: the study declares pre's rate grid centres at N = 12, 24, 48 only"),
    ("own-rate-jobs-0", "benchmarks.own_rate run --jobs 0 --out {tmp}/o", "--jobs must be at least 1, got 0"),
    ("depth-transfer-jobs-0", "benchmarks.depth_transfer run --jobs 0 --out {tmp}/o",
     "--jobs must be at least 1, got 0"),
    ("muon-study-transfer-depth-not-run", "benchmarks.muon_study run --depths 12 24 --out {tmp}/o",
     "the rate-transfer depth N = 6 must be one of --depths 12 24"),
    ("own-rate-plan-missing", "benchmarks.own_rate run --out {tmp}/o", "plan.json is missing"),
    ("study-rerun-other-steps", STUDY + " --out {study} --steps 3",
     "holds records made under other settings (base: ['train.max_steps=2'] -> ['train.max_steps=3'])"),
    ("study-rerun-other-width", STUDY + " --out {study} --steps 2 --dim 48",
     "holds records made under other settings (base: ['model.dim=32'] -> ['model.dim=48'])"),
    # issue 60: a GGUF file lacking a tensor its header implies (transformers would start it at random), a cache
    # that cannot be written (blamed on the cache, not on a new --out)
    ("import-gguf-no-output-norm", "DEPTHLAB_CACHE={tmp}/cache import {gguf_no_norm} {tmp}/o",
     "lacks 1 tensor(s) its header implies (model.norm.weight"),
    ("analyze-gguf-2-blocks-1-stored", "DEPTHLAB_CACHE={tmp}/cache analyze {gguf_cut_block} --out {tmp}/o",
     "lacks 9 tensor(s) its header implies (model.layers.1."),
    ("analyze-gguf-cache-is-a-file", "DEPTHLAB_CACHE={txt} analyze {gguf_ok} --out {tmp}/o " + AN,
     "a.txt/gguf cannot be used (Not a directory"),
    ("prune-span-syntax", "prune {hf} --remove 5 {tmp}/o", "--remove expects START:END"),
    ("prune-span-letters", "prune {hf} --remove a:b {tmp}/o", "--remove expects START:END"),
    ("prune-span-too-far", "prune {hf} --remove 0:99 {tmp}/o", "cannot remove layers"),
    ("prune-span-reversed", "prune {hf} --remove 2:1 {tmp}/o", "cannot remove layers"),
    ("prune-every-layer", "prune {hf} --remove 0:2 {tmp}/o", "keeping at least one"),
    ("prune-span-from-beyond-the-end", "prune {hf} --remove -3: {tmp}/o", "cannot remove layers -3: of a 2-layer"),
    ("prune-span-every-layer-open", "prune {hf} --remove : {tmp}/o", "keeping at least one"),
    ("prune-missing", "prune {tmp}/missing --remove 0:1 {tmp}/o", "does not exist"),
    ("prune-prepared", "prune {prep} --remove 0:1 {tmp}/o", "prepared-data directory"),
    ("prune-several-runs", "prune {runs2} --remove 0:1 {tmp}/o", "holds 2 runs"),
    ("prune-refused-scheme", "prune {post} --remove 0:1 {tmp}/o", "cannot export scheme 'post'"),
    ("prune-onto-run", "prune {run} --remove 0:1 {victim}", "run directory"),
    ("prune-onto-file", "prune {hf} --remove 0:1 {txt}", "is a file"),
    ("prune-unwritable", "prune {hf} --remove 0:1 " + UNWRITABLE + "/o", "cannot write"),
    ("prune-onto-foreign", "prune {hf} --remove 0:1 {victim_foreign}", "--overwrite"),
    ("prune-onto-its-source", "prune {victim_hf} --remove 0:1 {victim_hf}", "own input"),
    ("prune-onto-its-source-overwrite", "prune {victim_hf} --remove 0:1 {victim_hf} --overwrite", "own input"),
    # --- duplicate (prune's sibling) and analyze --duplicate
    ("duplicate-span-syntax", "duplicate {hf} --span 5 {tmp}/o", "--span expects START:END"),
    ("duplicate-span-letters", "duplicate {hf} --span a:b {tmp}/o", "--span expects START:END"),
    ("duplicate-span-too-far", "duplicate {hf} --span 0:99 {tmp}/o", "cannot repeat layers 0:99 of a 2-layer"),
    ("duplicate-span-empty", "duplicate {hf} --span 1:1 {tmp}/o", "cannot repeat layers 1:1"),
    ("duplicate-span-reversed", "duplicate {hf} --span 2:1 {tmp}/o", "cannot repeat layers 2:1"),
    ("duplicate-span-from-beyond-the-end", "duplicate {hf} --span -3: {tmp}/o", "cannot repeat layers -3: of a"),
    ("duplicate-no-span", "duplicate {hf} {tmp}/o", "--span"),
    ("duplicate-missing", "duplicate {tmp}/missing --span 0:1 {tmp}/o", "does not exist"),
    ("duplicate-vit-hf", "duplicate {vit_hf} --span 0:1 {tmp}/o", "is a ViT (an image classifier)"),
    ("duplicate-onto-run", "duplicate {hf} --span 0:1 {victim}", "run directory"),
    ("duplicate-onto-its-source", "duplicate {victim_hf} --span 0:1 {victim_hf} --overwrite", "own input"),
    ("analyze-duplicate-0", "analyze {run} --duplicate 0", "--duplicate"),
    ("analyze-duplicate-layer-by-layer", "analyze {run} --duplicate 2 --layer-by-layer",
     "--duplicate has no effect with --layer-by-layer"),
    # --- import
    ("import-missing", "import {tmp}/missing {tmp}/o", "no such directory"),
    ("import-a-run", "import {run} {tmp}/o", "run directory"),
    ("import-prepared", "import {prep} {tmp}/o", "prepared-data directory"),
    ("import-unknown-scheme", "import {hf} {tmp}/o --scheme nope", "unknown norm scheme"),
    ("import-max-seq-len-0", "import {hf} {tmp}/o --max-seq-len 0", "--max-seq-len"),
    ("import-onto-run", "import {hf} {victim}", "run directory"),
    ("import-onto-file", "import {hf} {txt}", "is a file"),
    ("import-unwritable", "import {hf} " + UNWRITABLE + "/o", "cannot write"),
    ("import-onto-foreign", "import {hf} {victim_foreign}", "--overwrite"),
    ("import-lns-export-as-lns", "import {hf} {tmp}/o --scheme lns", "a second time"),
    # --- import: what it reads (issue 24)
    ("import-more-layers-than-weights", "import {hf_3_layers} {tmp}/o", "missing model.layers.2."),
    ("import-fewer-layers-than-weights", "import {hf_1_layer} {tmp}/o", "left over model.layers.1."),
    ("import-wrong-hidden-size", "import {hf_wide} {tmp}/o", "wrongly shaped"),
    ("import-one-wrongly-shaped", "import {hf_one_shape} {tmp}/o", "wrongly shaped"),
    ("import-nan-weights", "import {hf_nan} {tmp}/o", "NaN or inf"),
    ("import-truncated-safetensors", "import {hf_truncated} {tmp}/o", "cannot load Hugging Face model"),
    ("import-garbage-safetensors", "import {hf_garbage} {tmp}/o", "cannot load Hugging Face model"),
    ("import-no-tokenizer", "import {hf_no_tok} {tmp}/o", "--tokenizer FILE"),
    ("import-tokenizer-missing", "import {hf_no_tok} {tmp}/o --tokenizer {tmp}/t.json", "no such file"),
    ("import-tokenizer-too-big", "import {hf_no_tok} {tmp}/o --tokenizer {big_tok}", "not this model's tokenizer"),
    ("import-no-config", "import {foreign} {tmp}/o", "no config.json"),
    ("import-unknown-family", "import {hf_gpt2} {tmp}/o", "cannot import model type 'gpt2'"),
    ("import-vit-with-tokenizer", "import {vit_hf} {tmp}/o --tokenizer {big_tok}", "no meaning"),
    # --- options another option makes meaningless; what a command needs (issue 24)
    # (each kind of eval takes its own options only: argparse refuses the others)
    ("eval-tasks-with-commonsense", "eval commonsense {run} --tasks {tasks} --commonsense {commonsense}",
     "unrecognized arguments: --tasks"),
    ("eval-data-with-commonsense", "eval commonsense {run} --data {txt} --commonsense {commonsense}",
     "unrecognized arguments: --data"),
    ("eval-data-with-tasks", "eval tasks {run} --data {txt} --tasks {tasks}", "unrecognized arguments: --data"),
    ("eval-seq-len-with-tasks", "eval tasks {run} --seq-len 8 --tasks {tasks}", "unrecognized arguments: --seq-len"),
    ("eval-table-without-commonsense", "eval ppl {run} --table {tmp}/t", "unrecognized arguments: --table"),
    ("eval-overwrite-without-commonsense", "eval ppl {run} --overwrite", "unrecognized arguments: --overwrite"),
    ("eval-harness-with-commonsense", "eval harness {run} --harness x --commonsense {commonsense}", "--commonsense"),
    ("eval-tasks-on-vit", "eval tasks {vit} --tasks {tasks}", "needs a language model"),
    ("eval-commonsense-on-vit", "eval commonsense {vit} --commonsense {commonsense}", "needs a language model"),
    ("eval-ppl-on-vit", "eval ppl {vit}", "is a ViT (an image classifier): score it with `depthlab eval images`"),
    ("eval-images-on-lm", "eval images {run}", "is not a depthlab ViT"),
    ("eval-ppl-two-models", "eval ppl {run} {hf}", "unrecognized arguments"),
    ("eval-unknown-kind", "eval perplexity {run}", "invalid choice: 'perplexity'"),
    ("finetune-vit", "finetune {vit} --data {records}", "needs a language model"),
    ("finetune-hf-dir", "finetune {hf} --data {records}", "depthlab import"),
    ("finetune-seq-len-0", "finetune {run} --data {records} --seq-len 0", "--seq-len must be at least 1"),
    ("finetune-seq-len-negative", "finetune {run} --data {records} --seq-len -5", "--seq-len must be at least 1"),
    ("finetune-one-record", "finetune {run} --data {one_record}", "needs at least two"),
    ("finetune-json-object", "finetune {run} --data {records_object}", "one JSON object"),
    ("finetune-wrong-keys", "finetune {run} --data {records_wrong_keys}", "found keys"),
    ("finetune-data-missing", "finetune {run} --data {tmp}/missing.json", "cannot read instruction file"),
    ("vit-one-class", VIT + " --data {npz_one_class}", "at least two"),
    ("vit-text-named-npz", VIT + " --data {text_npz}", "not an .npz archive"),
    # --- analyze, compare, theory
    ("analyze-missing", "analyze {tmp}/missing", "does not exist"),
    ("analyze-foreign-dir", "analyze {foreign}", "neither a checkpoint nor a run directory"),
    ("analyze-prepared", "analyze {prep}", "prepared-data directory"),
    ("analyze-several-runs", "analyze {runs2}", "holds 2 runs"),
    ("analyze-all-corrupted", "analyze {corrupt} " + AN + " --out {tmp}/o", "no valid checkpoint"),
    ("analyze-seq-len-beyond-context", "analyze {run} --seq-len 1024 " + AN + " --out {tmp}/o", "context of 64"),
    ("analyze-seq-len-1", "analyze {run} --seq-len 1", "--seq-len"),
    ("analyze-tokens-0", "analyze {run} --tokens 0", "--tokens"),
    ("analyze-batch-size-0", "analyze {run} --batch-size 0", "--batch-size"),
    ("analyze-probes-0", "analyze {run} --probes 0", "--probes"),
    ("analyze-cuda-on-cpu", "analyze {run} --device cuda", "--device"),
    ("analyze-unknown-dtype", "analyze {run} --dtype float8 " + AN + " --out {tmp}/o", "unknown dtype"),
    ("analyze-data-missing", "analyze {run} --data {tmp}/missing.txt " + AN + " --out {tmp}/o", "does not exist"),
    ("analyze-out-file", "analyze {run} " + AN + " --out {txt}", "is a file"),
    ("analyze-out-run", "analyze {run} " + AN + " --out {victim}", "run directory"),
    ("analyze-out-hf", "analyze {run} " + AN + " --out {victim_hf}", "Hugging Face model directory"),
    ("analyze-out-foreign", "analyze {run} " + AN + " --out {victim_foreign}", "--overwrite"),
    ("analyze-out-unwritable", "analyze {run} " + AN + " --out " + UNWRITABLE + "/o", "cannot write"),
    ("analyze-generate-unknown-task", "analyze {run} --removal-generate sum:n=3", "unknown generation task 'sum:n=3'"),
    ("analyze-generate-bad-size", "analyze {run} --removal-generate add:digits=0", "digits must be a whole number"),
    ("analyze-generate-missing-file", "analyze {run} --removal-generate continue:{tmp}/missing.txt",
     "cannot read generation task file"),
    ("analyze-generate-missing-jsonl", "analyze {run} --removal-generate {tmp}/missing.jsonl",
     "cannot read generation task file"),
    ("analyze-generate-not-pairs", "analyze {run} --removal-generate {txt}", ":1: not JSON"),
    ("analyze-generate-depthlab-run", "analyze {run} " + AN.replace(" --no-removal", "") + " --removal-generate add:n=2"
     " --out {tmp}/o", "--removal-generate decodes with a Hugging Face model's KV cache"),
    ("analyze-generate-layer-by-layer", "analyze {run} --layer-by-layer --removal-generate add",
     "--removal-generate has no effect with --layer-by-layer"),
    ("compare-one-model", "compare {run}", "at least two models"),
    ("compare-labels-mismatch", "compare {run} {run} --labels a", "1 labels for 2 models"),
    ("compare-missing-model", "compare {run} {tmp}/missing " + AN, "does not exist"),
    ("compare-prepared", "compare {run} {prep} " + AN, "prepared-data directory"),
    ("compare-out-run", "compare {run} {run} " + AN + " --out {victim}", "run directory"),
    ("compare-garbage-metrics", "compare {analysis} {run} " + AN + " --out {tmp}/o", "not what `depthlab analyze`"),
    ("compare-out-an-analysis", "compare {run} {run} " + AN + " --out {victim_analysis}", "--overwrite"),
    ("compare-out-its-input", "compare {victim_analysis} {run} " + AN + " --out {victim_analysis} --overwrite",
     "own input"),
    ("theory-depth-1", "theory --depth 1 --out {tmp}/o", "--depth must be between 2"),
    ("theory-depth-huge", "theory --depth 100000000 --out {tmp}/o", "--depth must be between 2"),
    ("theory-c-nan", "theory --c nan --out {tmp}/o", "--c must be"),
    ("theory-sigma0-0", "theory --sigma0 0 --out {tmp}/o", "--sigma0 must be"),
    ("theory-out-foreign", "theory --depth 10 --out {victim_foreign}", "--overwrite"),
    ("theory-out-analysis", "theory --depth 10 --out {victim_analysis}", "--overwrite"),
    # --- eval commonsense --table: files
    ("table-onto-users-file", "eval commonsense {run} --commonsense {commonsense} --table {victim_docs}/README",
     "--overwrite"),
    ("table-onto-its-input", "eval commonsense {victim_hf} --commonsense {commonsense} --table {victim_hf}/config "
     "--overwrite", "own input"),
    ("table-onto-a-directory", "eval commonsense {run} --commonsense {commonsense} --table {victim_foreign}/sub",
     "is a directory"),
    ("theory-depth-not-int", "theory --depth x", "invalid int value"),
    # --- data prepare / info
    ("prepare-vocab-0", "data prepare {docs} --out {tmp}/o --vocab-size 0 --workers 1 --no-progress", "--vocab-size"),
    ("prepare-vocab-negative", "data prepare {docs} --out {tmp}/o --vocab-size -5 --workers 1 --no-progress",
     "--vocab-size"),
    ("prepare-vocab-below-bytes", "data prepare {docs} --out {tmp}/o --vocab-size 100 --workers 1 --no-progress",
     "--vocab-size"),
    ("prepare-workers-negative", "data prepare {docs} --out {tmp}/o --workers -1 --no-progress", "--workers"),
    # issue 34 item 8 (data prepare's flags that change nothing or cannot be used)
    ("prepare-unit-mb-negative", "data prepare {docs} --out {tmp}/o --unit-mb -1 --no-progress", "--unit-mb"),
    ("prepare-sample-mb-zero", "data prepare {docs} --out {tmp}/o --tokenizer-sample-mb 0 --no-progress",
     "--tokenizer-sample-mb"),
    ("prepare-builtin-mb-with-inputs", "data prepare {docs} --out {tmp}/o --builtin-mb 2 --no-progress",
     "--builtin-mb"),
    ("prepare-val-fraction-0", "data prepare {docs} --out {tmp}/o --val-fraction 0 --no-progress",
     "validation fraction"),
    # issue 50: a validation split that cannot be trusted, refused when the balanced rule is asked for by name
    ("prepare-held-out-untrusted", "data prepare {docs} --out {tmp}/o --held-out balanced --vocab-size 300 "
     "--workers 1 --no-progress", "effective documents (Kish), fewer than 30"),
    ("prepare-held-out-unknown", "data prepare {docs} --out {tmp}/o --held-out random --no-progress", "--held-out"),
    ("prepare-input-missing", "data prepare {tmp}/missing.txt --out {tmp}/o --no-progress", "does not exist"),
    ("prepare-tokenizer-missing", "data prepare {docs} --out {tmp}/o --tokenizer {tmp}/t.json --no-progress",
     "tokenizer"),
    ("prepare-out-file", "data prepare {docs} --out {txt} --vocab-size 300 --workers 1 --no-progress", "is a file"),
    ("prepare-out-run", "data prepare {docs} --out {victim} --vocab-size 300 --workers 1 --no-progress",
     "run directory"),
    ("prepare-out-hf", "data prepare {docs} --out {victim_hf} --vocab-size 300 --workers 1 --no-progress",
     "Hugging Face model directory"),
    ("prepare-out-other-inputs", "data prepare {txt} --out {victim_prep} --vocab-size 300 --workers 1 --no-progress",
     "other inputs"),
    ("prepare-out-unwritable", "data prepare {docs} --out " + UNWRITABLE + "/o --vocab-size 300 --no-progress",
     "cannot write"),
    ("prepare-oversized-line", "data prepare {bigline} --out {tmp}/o --vocab-size 300 --workers 1 --no-progress",
     "MB"),
    ("data-info-missing", "data info {tmp}/missing", "not a prepared-data directory"),
    ("data-info-run", "data info {run}", "not a prepared-data directory"),
    ("data-no-subcommand", "data", "required"),
    *[(f"dedup-threshold-{v}", f"data dedup {{docs}} --out {{tmp}}/k.jsonl --threshold {v}",
       f"--threshold must be above 0 and at most 1, got '{v}'") for v in ("1.5", "-1", "0")],
    # --- the command line itself
    ("unknown-command", "bogus", "invalid choice"),
    ("schemes-extra-argument", "schemes extra", "unrecognized arguments"),
    # issue 34 items 1-3, 13: an output that is, holds or sits inside one of the command's inputs, --overwrite or not
    ("export-onto-its-source-overwrite", "export {victim} {victim} --overwrite", "own input"),
    ("export-above-its-source-overwrite", "export {victim_runs}/only {victim_runs} --overwrite", "own input"),
    ("export-into-its-source", "export {victim} {victim}/hf", "own input"),
    ("export-adapter-onto-its-source", "export {victim} {victim} --adapter-only --overwrite", "own input"),
    ("prepare-out-is-its-input-overwrite",
     "data prepare {victim_docs} --out {victim_docs} --overwrite --vocab-size 300 --workers 1 --no-progress",
     "own input"),
    ("prepare-out-holds-its-input-overwrite",
     "data prepare {victim_docs}/README.md --out {victim_docs} --overwrite --vocab-size 300 --workers 1 --no-progress",
     "own input"),
    ("prepare-out-holds-its-glob-overwrite",
     "data prepare {victim_docs}/*.md --out {victim_docs} --overwrite --vocab-size 300 --workers 1 --no-progress",
     "own input"),
    ("prepare-out-inside-its-input",
     "data prepare {victim_docs} --out {victim_docs}/prepared --vocab-size 300 --workers 1 --no-progress",
     "own input"),
    ("prepare-out-is-its-tokenizer",
     "data prepare {txt} --tokenizer {victim_hf} --out {victim_hf} --overwrite --vocab-size 300 --workers 1 "
     "--no-progress", "own input"),
    ("train-run-dir-is-its-data", "train --data {victim_prep} --run-dir {victim_prep} {T}", "own input"),
    ("train-run-dir-is-its-data-overwrite", "train --data {victim_prep} --run-dir {victim_prep} --overwrite {T}",
     "own input"),
    ("train-out-is-its-data", "train --data {victim_prep} --out {victim_prep} {T}", "own input"),
    ("train-run-dir-holds-its-data-overwrite",
     "train --data {victim_docs}/README.md --run-dir {victim_docs} --overwrite {T}", "own input"),
    ("train-init-from-its-run-dir-overwrite",
     "train --data {txt} --init-from {victim} --run-dir {victim} --overwrite {T}", "own input"),
    ("train-resume-into-the-folder-above-overwrite",
     "train --resume {victim_runs}/only --run-dir {victim_runs} --overwrite {T}", "own input"),
    ("finetune-into-its-model-overwrite",
     "finetune {victim} --data {records} --run-dir {victim} --overwrite --no-progress", "own input"),
    ("finetune-out-inside-its-model", "finetune {victim} --data {records} --out {victim} --no-progress", "own input"),
    ("analyze-out-holds-its-data-overwrite",
     "analyze {run} --data {victim_docs}/README.md --out {victim_docs} --overwrite " + AN, "own input"),
    ("compare-out-holds-its-data-overwrite",
     "compare {run} {run} --data {victim_docs}/README.md --out {victim_docs} --overwrite " + AN, "own input"),
    # --- issue 34: a flag that changes nothing is refused (every numeric flag finite and in its range; a flag
    # without the flag it acts with); what traced back ends in one line; messages name the real problem
    ("train-world-size-without-dry-run", TRAIN + " --world-size 2", "--world-size has no effect without --dry-run"),
    ("train-gpu-memory-without-dry-run", TRAIN + " --gpu-memory 80", "--gpu-memory has no effect without --dry-run"),
    ("train-world-size-0", TRAIN + " --dry-run --world-size 0", "--world-size must be at least 1"),
    ("train-gpu-memory-nan", TRAIN + " --dry-run --gpu-memory nan", "--gpu-memory must be a finite number"),
    ("train-gpu-memory-0", TRAIN + " --dry-run --gpu-memory 0", "--gpu-memory must be positive"),
    ("train-gpu-memory-negative", TRAIN + " --dry-run --gpu-memory -5", "--gpu-memory must be positive"),
    ("train-dp-replicate-under-ddp", TRAIN + " --set train.dp_replicate=2", "no effect with train.parallel=ddp"),
    ("train-dp-shard-under-ddp", TRAIN + " --set train.dp_shard=2", "no effect with train.parallel=ddp"),
    ("analyze-interior-leaves-none", "analyze {run} --interior 1 1 --tokens 64 --no-jacobian --out {tmp}/o",
     "leaves no interior block"),
    ("compare-labels-twice", "compare {run} {run} --labels a a " + AN + " --out {tmp}/o", "--labels names two models"),
    ("finetune-lora-rank-above-width", "finetune {long} --data {records} --lora --lora-rank 1000 --run-dir {tmp}/f "
     "--no-progress", "above the width"),
    ("finetune-lora-alpha-inf", "finetune {run} --data {records} --lora --lora-alpha inf",
     "--lora-alpha must be a finite number"),
    ("finetune-lora-alpha-inf-set", "finetune {run} --data {records} --lora --set train.lora.alpha=inf",
     "LoRA alpha must be a positive finite number"),
    ("finetune-lora-alpha-0", "finetune {run} --data {records} --lora --lora-alpha 0",
     "--lora-alpha must be positive"),
    ("finetune-lora-dropout-nan", "finetune {run} --data {records} --lora --lora-dropout nan",
     "--lora-dropout must be a finite number"),
    ("analyze-window-seed-without-windows", "analyze {run} --window-seed 3",
     "--window-seed has no effect without --windows"),
    ("analyze-probes-without-jacobian", "analyze {run} --no-jacobian --probes 2",
     "--probes has no effect with --no-jacobian"),
    ("analyze-inert-delta-without-removal", "analyze {run} --no-removal --inert-delta 0.01",
     "--inert-delta has no effect with --no-removal"),
    ("analyze-no-removal-runs-without-removal", "analyze {run} --no-removal --no-removal-runs",
     "--no-removal-runs has no effect with --no-removal"),
    ("analyze-tokens-with-windows", "analyze {run} --windows 4 --tokens 100", "--tokens has no effect with --windows"),
    ("analyze-inert-delta-inf", "analyze {run} --inert-delta inf", "--inert-delta must be a finite number"),
    ("theory-power-inf", "theory --power inf --out {tmp}/o", "--power must be a finite number"),
    ("theory-power-negative", "theory --power -1 --out {tmp}/o", "--power must be a number >= 0"),
    ("eval-max-new-tokens-0", "eval commonsense {run} --commonsense {commonsense} --max-new-tokens 0",
     "--max-new-tokens must be at least 1"),
    ("eval-mmlu-shots-negative", "eval mmlu {run} --mmlu {commonsense} --mmlu-shots -1",
     "--mmlu-shots must be at least 0"),
    # issue 48: --max-memory naming a GPU this machine lacks (no GPU here), or one device twice
    ("eval-max-memory-gpu-absent", "eval ppl {hf} --data {txt} --device-map auto --max-memory 0=1GiB",
     "--max-memory cuda:0: this machine has no CUDA device"),
    ("eval-max-memory-device-twice", "eval ppl {hf} --data {txt} --device-map auto --max-memory cpu=1GiB cpu=2GiB",
     "'cpu=1GiB' and 'cpu=2GiB' size the same device"),
    ("eval-offload-folder-a-file", "eval ppl {hf} --data {txt} --device-map auto --max-memory cpu=1KB --offload-folder "
     "{txt_copy}", "a_copy.txt is a file; give a folder for the weights"),
    ("eval-offload-folder-uncreatable", "eval ppl {hf} --data {txt} --device-map auto --max-memory cpu=1KB "
     "--offload-folder " + UNWRITABLE, "cannot create it (Operation not permitted)"),
    ("prepare-val-fraction-nan", "data prepare {docs} --out {tmp}/o --val-fraction nan --no-progress",
     "--val-fraction must be a finite number"),
    ("prepare-builtin-mb-inf", "data prepare --out {tmp}/o --builtin-mb inf --no-progress",
     "--builtin-mb must be a finite number"),
    ("train-dry-run-dim-overflow", TRAIN + " --dry-run --set model.dim=1000000000000 --set model.n_heads=1",
     "more fp32 bytes than any machine"),
    ("analyze-window-seed-negative", "analyze {run} --windows 2 --window-seed -1", "--window-seed must be between 0"),
    ("analyze-window-seed-huge", "analyze {run} --windows 2 --window-seed 99999999999",
     "--window-seed must be between 0"),
    ("harness-answer-beyond-choices-first", "eval harness {run} --harness {task_answer_first}", "beyond its choices"),
    ("harness-answer-beyond-choices-later", "eval harness {run} --harness {task_answer_later}",
     "document 1: the answer 7 is not one of its 2 choices"),
    ("harness-yaml-error", "eval harness {run} --harness {task_bad_yaml}", "is not valid YAML"),
    ("import-pickled-weights", "import {hf_pickle} {tmp}/o", "is a pickle that depthlab will not load"),
    ("eval-pickled-weights", "eval ppl {hf_pickle} --data {txt}", "is a pickle that depthlab will not load"),
    ("import-pickled-vit", "import {vit_pickle} {tmp}/o", "is a pickle that depthlab will not load"),
    ("analyze-data-prepared", "analyze {run} --data {prep} " + AN + " --out {tmp}/o",
     "is a prepared-data directory (token files); analyze calibrates on text"),
    ("prune-vit-checkpoint", "prune {vit} --remove 0:1 {tmp}/o", "is a ViT (an image classifier)"),
    ("prune-vit-hf", "prune {vit_hf} --remove 0:1 {tmp}/o", "is a ViT (an image classifier)"),
    ("train-data-dev-null", TRAIN + " --data /dev/null", "is not a regular file or a folder"),
    ("eval-data-dev-null", "eval ppl {run} --data /dev/null", "is not a regular file or a folder"),
    ("train-data-two-lines", TRAIN + " --data {small}", "need at least 11"),
    ("eval-seq-len-on-vit", "eval images {vit} --seq-len 8", "unrecognized arguments: --seq-len"),
    ("analyze-tokens-on-vit", "analyze {vit} --tokens 100 --out {tmp}/o", "--tokens is a language model's"),
    ("analyze-windows-on-vit", "analyze {vit} --windows 3 --out {tmp}/o", "--windows is a language model's"),
    # issue 34 items 5-7, 9, 11: metadata and token files that were changed after they were written, MMLU and
    # JSON text inputs that would drop subjects or records unseen
    ("eval-checkpoint-meta-edited", "eval ppl {meta_edited_ckpt}", "meta.json does not match its checksum"),
    ("export-checkpoint-meta-edited", "export {meta_edited_ckpt} {tmp}/o", "meta.json does not match its checksum"),
    ("train-resume-checkpoint-meta-edited", "train --data {txt} --resume {meta_edited_ckpt} --run-dir {tmp}/r {T}",
     "meta.json does not match its checksum"),
    ("train-data-prepared-tokens-changed", TRAIN.replace("{txt}", "{prep_changed}"),
     "train.bin does not match the sha256 in index.json"),
    ("data-info-prepared-tokens-changed", "data info {prep_changed}", "does not match the sha256"),
    ("train-data-prepared-id-out-of-range", TRAIN.replace("{txt}", "{prep_bad_ids}"),
     "train.bin holds token id 60000 (at token 5)"),
    ("eval-data-prepared-id-out-of-range", "eval ppl {run} --data {prep_bad_ids}", "outside the tokenizer's 280 ids"),
    ("eval-mmlu-empty-subject", "eval mmlu {run} --mmlu {mmlu_empty_subject}", "law_test.csv holds no test questions"),
    ("eval-mmlu-both-layouts", "eval mmlu {run} --mmlu {mmlu_both_layouts}", "holds both layouts"),
    ("train-data-jsonl-text-null", TRAIN.replace("{txt}", "{jsonl_text_null}"), "jsonl:5: field 'text' is null"),
    ("train-data-jsonl-text-number", TRAIN.replace("{txt}", "{jsonl_text_number}"),
     "jsonl:5: field 'text' is of type int"),
    ("prepare-jsonl-text-null",
     "data prepare {jsonl_text_null} --out {tmp}/o --vocab-size 300 --workers 1 --no-progress",
     "jsonl:5: field 'text' is null"),
    # issue 48 items 1, 3, 5: every path a command reads is its input; an offload folder is never inside one
    ("prune-onto-its-analysis-overwrite",
     "prune {hf} {victim_analysis} --drop-lowest 1 --analysis {victim_analysis} --overwrite",
     "is prune's own input --analysis"),
    ("import-onto-its-tokenizer-overwrite",
     "import {hf} {victim_hf} --tokenizer {victim_hf}/tokenizer.json --overwrite",
     "holds import's own input --tokenizer"),
    ("train-run-dir-holds-its-config-overwrite",
     "train --data {txt} --config {victim}/config.json --run-dir {victim} --overwrite {T}",
     "holds train's own input --config"),
    ("eval-table-inside-its-tasks", "eval commonsense {run} --commonsense {victim_docs} --table {victim_docs}/t",
     "is inside eval commonsense's own input --commonsense"),
    ("analyze-offload-folder-is-its-model", "analyze {victim} --device-map auto --offload-folder {victim}",
     "is analyze's own input MODEL; choose another --offload-folder"),
    ("eval-offload-folder-inside-its-model",
     "eval ppl {victim_hf} --data {txt} --device-map auto --offload-folder {victim_hf}/offload",
     "is inside eval ppl's own input MODEL"),
    ("compare-offload-folder-inside-its-data",
     "compare {run} {run} --data {victim_docs} --device-map auto --offload-folder {victim_docs}/o " + AN,
     "is inside compare's own input --data"),
    # issue 48 items 4-5: records read by the one JSON-lines reader, and the golden check's flags and file
    ("coord-check-records-bad-line", COORD + "{coord_bad_line}", "coord_check.jsonl:1: not a JSON record"),
    ("coord-check-records-without-field", COORD + "{coord_no_field}", "coord_check.jsonl:2: a record without"),
    ("golden-cases-unknown", "golden check --cases nosuch", "unknown golden case(s) nosuch; the cases are pre,"),
    ("golden-atol-nan", "golden check --atol nan", "--atol must be a finite number"),
    ("golden-atol-negative", "golden check --atol -1", "--atol must be a number >= 0"),
    ("golden-file-truncated", "golden check --file {golden_truncated}", "is not a golden losses file (not JSON"),
    # issue 52 item 4: greedy pruning ({hf} has 2 blocks)
    ("prune-greedy-drop-every-block", "prune {hf} {tmp}/o --drop-lowest 2 --greedy --tokens 64",
     "--drop-lowest 2: the model has 2 blocks; drop 1..1"),
    ("prune-greedy-drop-0", "prune {hf} {tmp}/o --drop-lowest 0 --greedy", "--drop-lowest must be"),
    ("prune-greedy-without-drop", "prune {hf} {tmp}/o --greedy", "--greedy removes --drop-lowest K blocks"),
    ("prune-greedy-by-unknown", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --by perplexity", "invalid choice"),
    ("prune-greedy-tasks-without-questions", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --by tasks",
     "--greedy --by tasks needs questions"),
    ("prune-greedy-questions-by-loss", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --tasks {tasks}",
     "--tasks has no effect with --by loss"),
    ("prune-greedy-generate-without-tasks", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --by generate",
     "--greedy --by generate needs generation tasks"),
    ("prune-greedy-generate-by-tasks", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --by tasks --tasks {tasks} "
     "--generate add", "--generate has no effect with --by tasks"),
    ("prune-greedy-generate-unknown-task", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --by generate --generate sub",
     "unknown generation task 'sub'"),
    ("prune-greedy-with-analysis", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --analysis {txt}",
     "--greedy scores the blocks itself"),
    ("prune-data-without-greedy", "prune {hf} {tmp}/o --remove 0:1 --data {txt}",
     "--data has no effect without --greedy"),
    # issue 60: an input named inside a task spec is read like any other (the folder holding it is never replaced:
    # before, the analysis ran and --overwrite deleted README.md, exit 0)
    ("analyze-out-holds-its-continue-file", "analyze {hf} --removal-generate " + CONTINUE + " --out {victim_docs} "
     "--overwrite --tokens 64 --no-jacobian", "holds analyze's own input --removal-generate"),
    ("compare-out-holds-its-continue-file", "compare {hf} {hf} --removal-generate " + CONTINUE + " --out "
     "{victim_docs} --overwrite --tokens 64 --no-jacobian", "holds compare's own input --removal-generate"),
    ("prune-out-holds-its-continue-file", "prune {hf} {victim_docs} --drop-lowest 1 --greedy --by generate "
     "--generate " + CONTINUE + " --overwrite", "holds prune's own input --generate"),
    # issue 60: results are keyed by name: a task given twice is refused; a card that does not parse is one line
    ("eval-tasks-same-file-twice", "eval tasks {run} --tasks {tasks} {tasks}", "--tasks names"),
    ("analyze-removal-generate-twice", "analyze {hf} --removal-generate add add --tokens 64 --no-jacobian --out "
     "{tmp}/o", "--removal-generate names add twice"),
    ("prune-generate-twice", "prune {hf} {tmp}/o --drop-lowest 1 --greedy --by generate --generate copy copy",
     "--generate names copy twice"),
    ("eval-card-metadata-not-yaml", "eval tasks {hf_bad_card} --tasks {tasks} --card {hf_bad_card}",
     "README.md: its metadata (the YAML between the --- lines) does not parse at line"),
    # issue 60: messages name what was given and the command's own option
    ("export-a-gguf-file", "export {gguf_f64} {tmp}/o", "f64.gguf is a GGUF file, not a depthlab checkpoint"),
    ("prune-greedy-generate-on-depthlab-run", "prune {run} {tmp}/o --drop-lowest 1 --greedy --by generate "
     "--generate add:n=2", "--generate decodes with a Hugging Face model's KV cache: "),
    # issue 60: the lm-eval entry, python -m depthlab.eval.lmeval: the depthlab model's settings, the device and the
    # batch size checked before lm-eval builds anything; lm-eval's --limit and task names
    ("lmeval-model-path-missing", LMEVAL + "path={tmp}/missing", "model path"),
    ("lmeval-model-path-not-a-model", LMEVAL + "path={foreign}", "neither a checkpoint nor a run directory"),
    ("lmeval-dtype-unknown", LMEVAL + "path={run},dtype=fp17", "--model_args dtype=fp17: give one of float32"),
    ("lmeval-cuda-on-cpu", LMEVAL.replace("cpu", "cuda") + "path={run}", "this machine has no CUDA device"),
    ("lmeval-no-path", LMEVAL + "dtype=float32", "--model_args needs path=MODEL"),
    ("lmeval-unknown-model-arg", LMEVAL + "path={run},temperature=0", "unknown --model_args temperature"),
    ("lmeval-pretrained-not-path", LMEVAL + "pretrained={run}", "named by path=, not pretrained="),
    ("lmeval-batch-size-0", LMEVAL + "path={run} --batch_size 0", "--batch_size 0: give a whole number"),
    ("lmeval-batch-size-negative", LMEVAL + "path={run} --batch_size -1", "--batch_size -1: give a whole number"),
    ("lmeval-batch-size-text", LMEVAL + "path={run} --batch_size abc", "--batch_size abc: give a whole number"),
    ("lmeval-max-gen-toks-text", LMEVAL + "path={run},max_gen_toks=abc", "--model_args max_gen_toks abc"),
    ("lmeval-unknown-task", LMEVAL.replace("depthlab_mc", "nosuchtask") + "path={run}",
     "unknown lm-eval task: nosuchtask"),
    ("lmeval-limit-0", LMEVAL + "path={run} --limit 0", "--limit 0: give the examples per task"),
]

VICTIMS = {"victim": "run", "victim_hf": "hf", "victim_prep": "prep", "victim_foreign": "foreign",
           "victim_user_hf": "user_hf", "victim_runs": "runs1", "victim_analysis": "analysis",
           "victim_docs": "mydocs"}


# ---------------------------------------------------------------- the world
def _text(n: int) -> str:
    return "".join(f"Line {i}: the quick brown fox jumps over the lazy dog, again and again.\n" for i in range(n))


def invoke(argv: list[str]) -> tuple[int | None, str, str | None]:
    """depthlab.cli.main in this process (depthlab.golden's for `golden ...`, a study script's as its `python -m`
    runs it for `benchmarks.NAME ...`, depthlab.eval.lmeval's for `lmeval ...`): (exit status, stderr, traceback
    of an exception that escaped)."""
    if argv[:1] == ["golden"]:
        from depthlab.golden import main

        argv = argv[1:]
    elif argv[0].startswith("benchmarks."):
        import importlib

        from depthlab.cli import run_script

        script = importlib.import_module(argv[0]).main
        argv = argv[1:]

        def main(args):
            return run_script(script, args)
    elif argv[:1] == ["lmeval"]:  # lm-eval's command line with the depthlab model: python -m depthlab.eval.lmeval
        from depthlab.eval.lmeval import main

        argv = argv[1:]
    else:
        from depthlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    tb = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: B036 - anything that escapes main is what a user would see as a traceback
            code, tb = 1, traceback.format_exc()
    return code, err.getvalue(), tb


def _flip_byte(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


def build_world(root: Path) -> dict[str, str]:
    """The tiny world every case runs against; returns the placeholders."""
    from depthlab.checkpoint import save_checkpoint
    from depthlab.config import Config
    from depthlab.data.tokenizer import load_tokenizer
    from depthlab.model import Transformer

    w = {"T": TINY}
    (root / "a.txt").write_text(_text(400))
    w["txt"] = str(root / "a.txt")
    shutil.copy(root / "a.txt", root / "a_copy.txt")
    w["txt_copy"] = str(root / "a_copy.txt")
    run = root / "run"
    code, err, tb = invoke(["train", "--data", w["txt"], "--run-dir", str(run), *TINY.split(),
                            "--set", "train.ckpt_every=1"])
    assert code == 0, (err, tb)
    ckpt = sorted((run / "checkpoints").glob("step_*"))[-1]
    w.update(run=str(run), ckpt=str(ckpt))
    code, err, tb = invoke(["export", str(run), str(root / "hf")])
    assert code == 0, (err, tb)
    w["hf"] = str(root / "hf")
    shutil.copytree(root / "hf", root / "user_hf")  # an HF directory depthlab did not write
    (root / "user_hf" / "depthlab_export.json").unlink()
    shutil.copytree(root / "hf", root / "hf_bad_card")  # an export whose card's metadata does not parse
    card = root / "hf_bad_card" / "README.md"
    card.write_text(card.read_text().replace("library_name: transformers", "library_name: [transformers", 1))
    w["hf_bad_card"] = str(root / "hf_bad_card")
    docs = root / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"{i:02d}.txt").write_text(_text(10 + i))
    w["docs"] = str(docs)
    code, err, tb = invoke(["data", "prepare", str(docs), "--out", str(root / "prep"), "--vocab-size", "280",
                            "--workers", "1", "--no-progress"])
    assert code == 0, (err, tb)
    w["prep"] = str(root / "prep")
    for parent, names in (("runs1", ["only"]), ("runs2", ["a", "b"])):
        for name in names:
            shutil.copytree(run, root / parent / name)
        w[parent] = str(root / parent)
    shutil.copytree(ckpt, root / "loose" / ckpt.name)
    w["loose"] = str(root / "loose" / ckpt.name)
    shutil.copytree(run, root / "corrupt")
    for c in (root / "corrupt" / "checkpoints").glob("step_*"):
        _flip_byte(c / "model.safetensors")
    w["corrupt"] = str(root / "corrupt")
    w["corrupt_ckpt"] = str(sorted((root / "corrupt" / "checkpoints").glob("step_*"))[-1])
    tok = load_tokenizer(ckpt / "tokenizer.json")
    cfg = Config.load(ckpt / "config.json")
    cfg.model.norm_scheme = "post"
    save_checkpoint(root / "post", Transformer(cfg.model).state_dict(), cfg, {"step": 0}, tok)
    cfg.model.norm_scheme = "pre"
    save_checkpoint(root / "imported", Transformer(cfg.model).state_dict(), cfg, {"step": 0}, tok)
    w.update(post=str(root / "post"), imported=str(root / "imported"))
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("my own notes\n")
    (root / "foreign" / "sub.md").mkdir()
    w["foreign"] = str(root / "foreign")
    (root / "mydocs").mkdir()
    (root / "mydocs" / "README.md").write_text("# my project\n")
    (root / "mydocs" / "README.json").write_text('{"mine": true}\n')
    import numpy as np

    np.savez(root / "huge_label.npz", x=np.zeros((20, 8, 8), np.float32), y=np.array([0] * 19 + [10**9]))
    w["npz_huge_label"] = str(root / "huge_label.npz")
    w["commonsense"] = str(Path(__file__).parent / "data" / "commonsense" / "eval")
    _bad_hf_dirs(root, w)
    code, err, tb = invoke(VIT.replace("{tmp}/v", str(root / "vit")).split())
    assert code == 0, (err, tb)
    code, err, tb = invoke(["export", str(root / "vit"), str(root / "vit_hf")])
    assert code == 0, (err, tb)
    w.update(vit=str(root / "vit"), vit_hf=str(root / "vit_hf"))
    rec = {"instruction": "say", "input": "", "output": "fox"}
    (root / "records.json").write_text(json.dumps([rec] * 5))
    (root / "one_record.json").write_text(json.dumps([rec]))
    (root / "records_object.json").write_text(json.dumps({"data": [rec] * 5}, indent=1))
    (root / "records_wrong_keys.jsonl").write_text(json.dumps({"prompt": "say", "completion": "fox"}) + "\n")
    np.savez(root / "one_class.npz", x=np.zeros((20, 8, 8), np.float32), y=np.zeros(20, np.int64))
    (root / "text.npz").write_text("just some text\n")
    for name in ("records", "one_record", "records_object"):
        w[name] = str(root / f"{name}.json")
    w.update(records_wrong_keys=str(root / "records_wrong_keys.jsonl"), npz_one_class=str(root / "one_class.npz"),
             text_npz=str(root / "text.npz"))
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    w["deep_json"] = str(root / "deep.json")
    import numpy as np

    from tests.gguf_fixtures import bpe_tokenizer, tiny_llama, write_gguf

    tok = bpe_tokenizer()  # a GGUF file whose matrices are of a type no reader dequantizes (F64)
    write_gguf(root / "f64.gguf", tiny_llama(tok.get_vocab_size(), n_layers=1), tok, matrix_dtype=np.float64)
    w["gguf_f64"] = str(root / "f64.gguf")
    blocks = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm")
    for name, layers, leave_out in (("gguf_ok", 1, ()), ("gguf_no_norm", 1, ("output_norm.weight",)),
                                    ("gguf_cut_block", 2, tuple(f"blk.1.{b}.weight" for b in blocks))):
        write_gguf(root / f"{name}.gguf", tiny_llama(tok.get_vocab_size(), n_layers=layers), tok, leave_out=leave_out)
        w[name] = str(root / f"{name}.gguf")
    (root / "analysis").mkdir()
    (root / "analysis" / "metrics.json").write_text("{}\n")
    (root / "analysis" / "report.html").write_text("<html></html>\n")
    w["analysis"] = str(root / "analysis")
    files = {"small": "two lines\nonly\n", "empty": "", "yaml_bad": "model:\n  dim: 32\n - oops\n",
             "yaml_list": "- a\n- b\n", "badjsonl": '{"text": "a"}\n{"text": "b"\n',
             "nofield": '{"txt": "a"}\n', "tasks_bad": "{not json\n",
             "deepjsonl": '{"text": "a"}\n{"text": ' + "[" * 100_000 + "\n",
             "tasks": json.dumps({"question": "the", "choices": ["fox", "dog"], "answer": 0}) + "\n"}
    suffix = {"yaml_bad": ".yaml", "yaml_list": ".yaml", "badjsonl": ".jsonl", "nofield": ".jsonl",
              "deepjsonl": ".jsonl",
              "tasks_bad": ".jsonl", "tasks": ".jsonl"}
    for name, content in files.items():
        (root / (name + suffix.get(name, ".txt"))).write_text(content)
        w[name] = str(root / (name + suffix.get(name, ".txt")))
    record = json.dumps({"name": "a", "depth": 2, "seed": 0, "step": 0, "update": [0.0], "ratio": [0.0], "rms": [1]})
    for name, text in (("coord_bad_line", '{"name": "a", "dep\n' + record + "\n"),
                       ("coord_no_field", record + '\n{"name": "b"}\n')):
        (root / name).mkdir()
        (root / name / "coord_check.jsonl").write_text(text)
        w[name] = str(root / name)
    (root / "golden_truncated.json").write_text((Path(__file__).parent / "golden" / "losses.json").read_text()[:3000])
    w["golden_truncated"] = str(root / "golden_truncated.json")
    (root / "json_unknown.json").write_text(json.dumps({"model": {"depth": 3}}))
    w["json_unknown"] = str(root / "json_unknown.json")
    (root / "bin.txt").write_bytes(bytes(range(256)) * 10)
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50)
    w.update(bin=str(root / "bin.txt"), latin1=str(root / "latin1.txt"))
    # one line of about 2 MB (the limit is lowered to 1 MB for the cases) among short ones, where the
    # held-out rule would make it the whole validation split
    lines = _text(20).splitlines(keepends=True)
    lines[10] = "word " * 400_000 + "\n"
    (root / "bigline.txt").write_text("".join(lines))
    w["bigline"] = str(root / "bigline.txt")
    _issue34_world(root, w, cfg, tok)
    _integrity_world(root, w)
    _study_world(root, w)
    return w


MC_TASK = """task: depthlab_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: question
doc_to_choice: {choices}
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _issue34_world(root: Path, w: dict, cfg, tok) -> None:
    """Weights pickled with more than tensors, a checkpoint with a longer context (its records fit), lm-eval tasks
    whose answers are beyond their choices or whose YAML is broken."""
    import copy
    import pathlib

    import torch
    from safetensors.torch import load_file

    from depthlab.checkpoint import save_checkpoint
    from depthlab.model import Transformer

    for name, source in (("hf_pickle", "hf"), ("vit_pickle", "vit_hf")):
        d = root / name
        shutil.copytree(root / source, d)
        (d / "depthlab_export.json").unlink()
        state = load_file(str(d / "model.safetensors"))
        (d / "model.safetensors").unlink()
        torch.save({**state, "note": pathlib.PurePosixPath("not/a/tensor")}, d / "pytorch_model.bin")
        w[name] = str(d)
    long = copy.deepcopy(cfg)
    long.model.max_seq_len = 256
    save_checkpoint(root / "long", Transformer(long.model).state_dict(), long, {"step": 0}, tok)
    w["long"] = str(root / "long")
    for name, answers, choices in (("task_answer_first", [5, 0], "choices"), ("task_answer_later", [0, 7], "choices"),
                                   ("task_bad_yaml", [0, 0], "[choices")):
        d = root / name
        d.mkdir()
        rows = [{"question": "the", "choices": ["fox", "dog"], "answer": a} for a in answers]
        (d / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "mc.yaml").write_text(MC_TASK.format(path=d / "mc.jsonl", choices=choices))
        w[name] = str(d / "mc.yaml")


def _study_world(root: Path, w: dict) -> None:
    """A depth-transfer study of one 2-step cell (its record and settings.json in `study`, its corpus in
    `study_runs`): what a rerun with other settings must not take for its own. The record is written here (the
    runner trains cells in worker processes, which the fast tier has none of); the study run writes the rest."""
    (root / "study").mkdir()
    (root / "study" / "runs.jsonl").write_text(json.dumps(
        {"study": "transfer", "key": "pre-L2-lr0.004-seed0", "variant": "pre", "lr": 0.004, "seed": 0, "layers": 2,
         "status": "ok", "val_loss": 5.75, "val": {"val_loss": 5.75}, "steps": 2, "tokens": 256}) + "\n")
    code, err, tb = invoke([*STUDY.format(**w, study_runs=root / "study_runs").split(), "--out", str(root / "study"),
                            "--steps", "2"])
    assert code == 0 and (root / "study" / "settings.json").is_file(), (err, tb)
    w.update(study=str(root / "study"), study_runs=str(root / "study_runs"))


def _integrity_world(root: Path, w: dict) -> None:
    """A checkpoint whose meta.json step was edited, prepared data with a changed token or (from before the
    checksums) an id outside its vocabulary, MMLU folders with an empty subject or both layouts, JSON lines whose
    text is null or a number."""
    import csv

    import numpy as np

    run = root / "meta_edited"
    shutil.copytree(w["run"], run)
    ckpt = sorted((run / "checkpoints").glob("step_*"))[-1]
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "step": 7}, indent=2) + "\n")
    w["meta_edited_ckpt"] = str(ckpt)
    for name in ("prep_changed", "prep_bad_ids"):
        shutil.copytree(w["prep"], root / name)
        w[name] = str(root / name)
        index = json.loads((root / name / "index.json").read_text())
        for split in ("train", "val"):
            tokens = np.fromfile(root / name / f"{split}.bin", dtype=index["dtype"])
            tokens[5] = 60000 if name == "prep_bad_ids" else (int(tokens[5]) + 1) % index["vocab_size"]
            tokens.tofile(root / name / f"{split}.bin")
            if name == "prep_bad_ids":  # data prepared before the checksums: only the ids can be checked
                index["splits"][split].pop("sha256", None)
        (root / name / "index.json").write_text(json.dumps(index))
    row = ["What is 2 + 2?", "3", "4", "5", "6", "B"]
    for name, subjects in (("mmlu_empty_subject", {"math": [row] * 2, "law": []}),
                           ("mmlu_both_layouts", {"math": [row] * 2})):
        (root / name / "test").mkdir(parents=True)
        for subject, rows in subjects.items():
            with open(root / name / "test" / f"{subject}_test.csv", "w", newline="") as f:
                csv.writer(f).writerows(rows)
        w[name] = str(root / name)
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "mmlu_both_layouts" / "law").mkdir()
    pq.write_table(pa.Table.from_pylist([{"question": "q?", "choices": ["a", "b", "c", "d"], "answer": 1}]),
                   root / "mmlu_both_layouts" / "law" / "test-00000-of-00001.parquet")
    for name, value in (("jsonl_text_null", None), ("jsonl_text_number", 12345)):
        records = [{"text": line} for line in _text(400).splitlines()]
        records[4] = {"text": value}
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        w[name] = str(root / f"{name}.jsonl")


def _bad_hf_dirs(root: Path, w: dict) -> None:
    """Copies of the export with config.json and weights that disagree, broken weights, no tokenizer."""
    hf = root / "hf"
    cfg = json.loads((hf / "config.json").read_text())

    def variant(name: str, **fields) -> Path:
        d = root / name
        shutil.copytree(hf, d)
        (d / "depthlab_export.json").unlink()
        (d / "config.json").write_text(json.dumps({**cfg, **fields}))
        w[name] = str(d)
        return d

    variant("hf_3_layers", num_hidden_layers=3)
    variant("hf_1_layer", num_hidden_layers=1)
    variant("hf_wide", hidden_size=64)
    variant("hf_one_shape", intermediate_size=48)
    variant("hf_gpt2", model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (variant("hf_no_tok") / "tokenizer.json").unlink()
    (root / "hf_no_tok" / "tokenizer_config.json").unlink()
    weights = variant("hf_truncated") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    (variant("hf_garbage") / "model.safetensors").write_bytes(b"\x00" * 64)
    from safetensors.torch import load_file, save_file

    d = variant("hf_nan")
    state = load_file(str(d / "model.safetensors"))
    state["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(state, str(d / "model.safetensors"), {"format": "pt"})
    from tokenizers import Tokenizer, models

    big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    big.save(str(root / "big_tok.json"))
    w["big_tok"] = str(root / "big_tok.json")


_DIGESTS: dict[tuple, str] = {}  # (path, inode, size, mtime) -> sha256: the world is hashed once, not per case


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file (by content) and directory under roots."""
    out = {}
    for root in roots:
        for dirpath, _, filenames in os.walk(root):
            out[dirpath] = "dir"
            for f in filenames:
                p = Path(dirpath) / f
                st = p.stat()
                key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns)
                if key not in _DIGESTS:
                    _DIGESTS[key] = hashlib.sha256(p.read_bytes()).hexdigest()
                out[str(p)] = _DIGESTS[key]
    return out


def run_case(world: dict, root: Path, case: tuple) -> dict:
    """Run one case; returns its outcome: clean | traceback | exit-0 | data-loss | unclear, and details."""
    name, command = case[0], case[1]
    tmp = root / "cases" / name
    tmp.mkdir(parents=True)
    places = {**world, "tmp": str(tmp)}
    for victim, source in VICTIMS.items():
        if "{" + victim + "}" in command:
            shutil.copytree(world.get(source) or root / source, tmp / victim)
            places[victim] = str(tmp / victim)
    argv, env = [], {}
    for word in command.split():
        if not argv and re.fullmatch(r"[A-Z_]+=\S*", word):  # an environment variable the case sets
            key, value = word.split("=", 1)
            env[key] = value.format(**places)
        elif word == "{T}":
            argv += TINY.split()
        else:
            argv.append(word.format(**places))
    world_dirs = [root / k for k in sorted(os.listdir(root)) if k != "cases"]
    before = snapshot(tmp, *world_dirs)
    with _small_document_limit(), _environment(env):
        code, err, tb = invoke(argv)
    after = snapshot(tmp, *world_dirs)
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("depthlab: error:")]
    changed = sorted(k for k in before if after.get(k) != before[k])
    created = sorted(set(after) - set(before))
    if changed:
        outcome = "data-loss"
    elif tb is not None or "Traceback" in err:
        outcome = "traceback"
    elif code == 0:
        outcome = "exit-0"
    elif code == 2 and len(lines) == 1 and len(errors) == 1 and not created:
        outcome = "clean"
    else:
        outcome = "unclear"
    return {"outcome": outcome, "code": code, "stderr": err, "traceback": tb, "changed": changed, "created": created,
            "line": errors[0] if len(errors) == 1 else None}


@contextlib.contextmanager
def _environment(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _small_document_limit():
    """The oversized-document cases use a 2 MB line against a 1 MB limit, so they stay fast."""
    try:
        from depthlab.data import prepare
    except ImportError:
        yield
        return
    saved = getattr(prepare, "MAX_DOCUMENT_BYTES", None)
    prepare.MAX_DOCUMENT_BYTES = 1_000_000
    try:
        yield
    finally:
        if saved is None:
            del prepare.MAX_DOCUMENT_BYTES
        else:
            prepare.MAX_DOCUMENT_BYTES = saved


# ---------------------------------------------------------------- the test
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    return root, build_world(root)


def test_the_table_covers_at_least_100_cases():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(world, case):
    if case[1].startswith("lmeval"):
        pytest.importorskip("lm_eval", reason="the lm-eval entry needs lm-evaluation-harness")
    root, places = world
    res = run_case(places, root, case)
    assert not res["changed"], f"pre-existing files changed: {res['changed'][:5]}"
    assert res["traceback"] is None and "Traceback" not in res["stderr"], res["traceback"] or res["stderr"]
    assert res["code"] == 2, res["stderr"]
    assert res["outcome"] == "clean", (res["stderr"], res["created"][:5])
    assert case[2] in res["line"], res["line"]


@pytest.mark.parametrize("name", ["train-config-yaml-syntax", "eval-cuda-on-cpu", "export-onto-run"])
@pytest.mark.slow
def test_a_real_process_gives_the_same_single_line(world, name, tmp_path):
    """In-process calls above; a few in a real process, where an uncaught exception would print a traceback."""
    import subprocess

    root, places = world
    command = dict((c[0], c[1]) for c in CASES)[name]
    places = {**places, "tmp": str(tmp_path), "victim": str(tmp_path / "victim")}
    shutil.copytree(places["run"], tmp_path / "victim")
    argv = [w for word in command.split() for w in (TINY.split() if word == "{T}" else [word.format(**places)])]
    before = snapshot(tmp_path)
    res = subprocess.run([sys.executable, "-m", "depthlab", *argv], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("depthlab: error:"), \
        res.stderr
    assert snapshot(tmp_path) == before


if __name__ == "__main__":  # the outcome of every case, and the counts, for the depthlab on PYTHONPATH
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        places = build_world(root)
        counts: dict[str, int] = {}
        for case in CASES:
            res = run_case(places, root, case)
            if res["outcome"] == "clean" and case[2] not in res["line"]:
                res["outcome"] = "clean-other-message"
            counts[res["outcome"]] = counts.get(res["outcome"], 0) + 1
            detail = (res["line"] or "".join(res["stderr"].strip().splitlines()[-1:]))[:150]
            if res["traceback"]:
                detail = res["traceback"].strip().splitlines()[-1][:150]
            print(f"{res['outcome']:20s} {case[0]:36s} {detail}", flush=True)
        print(json.dumps({"cases": len(CASES), **counts}))
        sys.exit(0)
