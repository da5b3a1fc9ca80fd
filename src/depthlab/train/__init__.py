"""Training: the loop and what plugs into it.

trainer.py      the loop: packed batches, gradient accumulation, bf16 autocast, validation perplexity,
                logging, checkpoints and exact resume, the non-finite guard; one Trainer for every task (the run
                directory it writes, its metrics log and resume rules: depthlab.runfolder)
tasks.py        what a run trains on: the Task interface (data, sampler, validation, checkpoint meta) and
                LanguageModelling; vision.py ImageClassification and finetune.py Finetuning are the others
vision.py       image classification for model.family=vit
runtime.py      the toolbox the loop shares with the studies: seeding and RNG state, environment record,
                deferred signals (its validation scorers are depthlab.eval's)
finetune.py     supervised fine-tuning on instruction data (loss on the response tokens only)
optim.py        AdamW with decay on matrices only (or Muon on the blocks' matrices, AdamW on the rest), linear
                warmup then cosine decay to a floor
coordcheck.py   `depthlab coord-check`: a few steps at several depths, each block's update and scale
callbacks.py    depth monitors, TensorBoard and Weights & Biases loggers, as trainer callbacks
distributed.py  torchrun: DDP or FSDP2 applied after the model is built, full-state checkpoints
flops.py        training FLOPs per token and the device's peak, for MFU; the throughput meter of the log lines
cli.py          `depthlab finetune`
"""
