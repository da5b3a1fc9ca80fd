# Two commands on a fresh clone: `make demo` (train the CPU demo) and `make test` (the test suite).
# Both create .venv themselves: CPU PyTorch 2.13.0 (pinned: an unpinned torch pulls a multi-GB CUDA build). The demo
# installs depthlab alone (.venv/.base); `make install` and `make test` add the test extra (transformers, lm-eval,
# datasets, peft, trackio, ...: about 2 GB more), which .ci/run installs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast install clean results study study-grid study-sweep study-mixln study-vit study-lns study-along study-gpu-prepare study-gpu speed

install: $(VENV)/.installed

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.base
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/depthlab train

test: install
	$(PY) -m pytest

test-fast: install  # the tests not marked slow (README, Development): about 2.3 CPU-minutes, in one process
	$(PY) -m pytest -m "not slow"

# docs/results.md, in parts (each one `make` call; wall times on 2 cores are in docs/results.md). Every part appends
# to its result file under benchmarks/results/, so a part can be run again or split by --variants / --seeds.
BENCH := PYTHONPATH=$(CURDIR)/src:$(CURDIR) $(PY) -m benchmarks

# The depth study (docs/results.md, section 1): each part <= 45 min wall on 2 cores except study-sweep (its
# 48-block runs take about 15 min each per core); parts append to benchmarks/results/depth_study/runs.jsonl.
STUDY := $(BENCH).depth_study run --runs-dir /tmp/depthlab_study_runs

study: study-grid study-sweep study-mixln

study-grid: install  # pre and lns at 24 blocks, lr 1e-3 / 2e-3 / 4e-3 / 8e-3 / 1.6e-2, seed 0
	$(STUDY) --phases grid

study-sweep: install  # pre and lns at 6, 12, 24, 48 blocks, seeds 0 and 1 (and 2 at 24), each at its best rate
	$(STUDY) --phases sweep

study-mixln: install  # mixln at 24 blocks: its own grid, then seed 1 at its best rate
	$(STUDY) --phases mixln

# Why LNS wins (docs/results.md, section 9; benchmarks/lns_study.py): each depth at its own rate, LNS taken apart and
# the stability claims (hours on 2 cores; resumable), then the curse along training (15M tokens per run, about 3 h).
# study-gpu: the `along` question at width 128 on one GPU (prepare its corpus here first, carry lns_study_gpu_runs/).
LNS := $(BENCH).lns_study

study-lns: install
	$(LNS) run --runs-dir /tmp/depthlab_lns_runs

study-along: install
	$(LNS) run --phases along --runs-dir /tmp/depthlab_along_runs

study-gpu-prepare: install
	$(LNS) prepare --gpu --runs-dir lns_study_gpu_runs

study-gpu:
	$(LNS) run --gpu --runs-dir lns_study_gpu_runs

# Depth transfer (issue 37; docs/method.md section 5.2): which parameterization carries a rate tuned at 6 blocks to
# 12, 24 and 48, and LNS taken apart at 48 (about 105 cells, 14 h or more on 2 cores; resumable, keep the runs dir).
# study-transfer-gpu: its part A at width 256 on one lent GPU (prepare its corpus here first, carry
# runs/depth_transfer_gpu; records in benchmarks/results/depth_transfer/gpu/).
.PHONY: study-transfer study-transfer-gpu-prepare study-transfer-gpu
study-transfer: install
	$(BENCH).depth_transfer run --jobs 2 --runs-dir /tmp/depthlab_transfer_runs

study-transfer-gpu-prepare: install
	$(BENCH).depth_transfer prepare --gpu --runs-dir runs/depth_transfer_gpu

study-transfer-gpu:
	$(BENCH).depth_transfer run --gpu --runs-dir runs/depth_transfer_gpu

# Own-rate study (issue 50; docs/method.md section 5.3): LNS against Pre-LN, each at its own validation-selected rate,
# on balanced held-out splits: N = 12 and 24 (24 cells, 3-4 h on 2 free cores, 8-16 h on a busy machine), then N = 48
# with gain-init and uniform gain (24 more, about twice that); resumable, keep the runs dir. OUT/plan.json is committed
# before the first cell.
OWN_RATE_RUNS ?= /tmp/depthlab_own_rate_runs
.PHONY: study-own-rate
study-own-rate: install
	nice -n 19 $(BENCH).own_rate run --jobs 2 --runs-dir $(OWN_RATE_RUNS)

# Muon study (issue 53; docs/method.md section 5.4): Pre-LN and LNS under Muon at N = 6, 12, 24, each at its own rate,
# 3 seeds, and N = 6's rate carried to 12 and 24 (42 cells or more); resumable. OUT/plan.json is committed first.
MUON_RUNS ?= /tmp/depthlab_muon_runs
.PHONY: study-muon
study-muon: install
	nice -n 19 $(BENCH).muon_study run --jobs 2 --runs-dir $(MUON_RUNS)

# Scalars study (issue 65; docs/method.md section 5.5): {Pre-LN, LNS} x {no scalars, learnable stream scalars} under
# Muon at N = 12, 24, 48, each arm at its own rate, 3 seeds (72 cells or more, depth by depth); resumable from the
# committed records (keep the runs dir for the corpus and the half-trained cells). OUT/plan.json is committed first.
SCALARS_RUNS ?= /tmp/depthlab_scalars_runs
SCALARS_JOBS ?= 1
.PHONY: study-scalars
study-scalars: install
	nice -n 19 $(BENCH).scalars_study run --jobs $(SCALARS_JOBS) --runs-dir $(SCALARS_RUNS)

# The paper's ViT row (docs/results.md, section 7): pre vs LNS after the norm vs LNS on the branch outputs, a
# 12 x 64 ViT on scikit-learn's digits, 600 steps, a rate grid then 3 seeds at each best rate (about 45 min).
study-vit: install
	$(BENCH).vit_study run --runs-dir /tmp/depthlab_vit_runs

speed: install  # run alone: timings share the machine's cores
	$(BENCH).train_speed --reps 7 --steps 2
	$(BENCH).lns_cost --reps 9 --steps 2 --case deep-thin llama-71m
	$(BENCH).train_speed --reps 1 --steps 1 --profile --dtype fp32 bf16 --out benchmarks/results/train_speed_profile.json
	$(BENCH).train_speed --case deep-thin llama-71m --dtype fp32 --compile --no-optimizer-swap --reps 5 --steps 2 --out benchmarks/results/train_speed_compile.json

results:  # docs/results.md (the studies) and docs/benchmarks.md (systems) from whatever result files exist
	$(BENCH).report

clean:
	rm -rf $(VENV) runs .pytest_cache

# Golden losses (docs/golden.md): today's code against tests/golden/losses.json, each case within 10 x its measured
# spread on other CPUs' kernels (benchmarks/golden_spread.py), so any machine passes an unchanged main; `--bitwise`
# on the machine that made the file (CI: the first 30 steps, tests/test_golden.py); golden-regen rewrites the file.
.PHONY: golden golden-regen gpu-day-one
golden: install
	$(PY) -m depthlab.golden check

golden-regen: install
	$(PY) -m depthlab.golden regen

# GPU day one (docs/scaling.md, last section): one H100/H200, about 8 minutes, into benchmarks/results/gpu_day_one/.
gpu-day-one:
	$(BENCH).gpu_day_one
