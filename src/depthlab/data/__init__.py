"""Data: text sources -> tokenizer -> prepared token files -> packed, resumable batches; and images for ViTs.

sources.py   local files (text, JSON lines, parquet), hf: datasets, the built-in corpus
tokenizer.py tokenizer.json / transformers directories / byte-level BPE, content hash
tokens.py    the held-out rule and batch encoding shared by every path
prepare.py   `depthlab data prepare`: parallel, resumable tokenization into memory-mappable token files
prepared.py  reading that format back: the index, the tokenizer, the memory-mapped splits
dataset.py   build_token_data (prepared or on the fly), SeededOrder (every sampler's order), PackedSampler,
             eval_batches
images.py    images for ViTs: scikit-learn's digits, ImageFolder trees, .npz, CIFAR-10; ImageSampler
cli.py       `depthlab data prepare | info`
"""
