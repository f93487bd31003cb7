# Everything runs inside .venv, created and filled on first use. Setup is keyed on the lock file:
# a second `make` with nothing changed only checks one stamp file.
PYTHON_BOOT ?= python3.11
VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
# Stage commands in dvc.yaml say `python`: the venv's, for make targets and the DVC runs they start.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
# Telemetry off for everything make starts (dvc, stages, servers); stages/__init__.py does the same for direct runs.
export DO_NOT_TRACK = 1
export GX_ANALYTICS_ENABLED = False
export MLFLOW_DISABLE_TELEMETRY = true
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export HF_HUB_DISABLE_TELEMETRY = 1

.PHONY: setup run register test test-all docs lint format bench-train bench-teacher bench-gpu exp bench-eval bench-embed bench-domain analyses report serve stop clean

setup: $(STAMP) .dvc/config

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev,team]'
	@touch $(STAMP)

# .dvc/ is committed; this only matters for a tree exported without it.
.dvc/config:
	$(VENV)/bin/dvc init --quiet $$(git rev-parse --git-dir >/dev/null 2>&1 || echo --no-scm)
	$(VENV)/bin/dvc config core.analytics false

run: setup
	$(VENV)/bin/dvc repro

# Register models/export again (e.g. after pointing MLFLOW_TRACKING_URI at another server): `make run` registers
# only when dvc.yaml's register stage is stale or this clone has no receipt (metrics/registry.json) yet.
register: setup
	$(VENV)/bin/dvc repro --force --single-item register

# The fast tests, including a strict build of the documentation site (tests/repo/test_docs.py).
test: setup
	$(PY) -m pytest -q

test-all: setup
	$(PY) -m pytest -q -m ''

# The documentation site (docs/, mkdocs.yml) into site/; `make test` builds it strictly (tests/repo/test_docs.py).
docs: setup
	$(VENV)/bin/mkdocs build --strict

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

# Training throughput of the transfer loop (fp32 and bf16) against a plain Hugging Face fp32 loop, as ratios.
bench-train: setup
	$(PY) -m benchmarks.bench_train

# The teacher's encoding settings (ONNX Runtime's fusions of its graph, workers against threads); needs dvc repro validate.
bench-teacher: setup
	$(PY) -m benchmarks.bench_teacher

# One prepared run for a lent GPU: BERT-base in bf16 at a batch that fills the device, tokens/s, MFU against
# GPU_ARGS="--peak-tflops N" (default H200, 989), NCCL, peak memory, evaluation; on a CPU, the bundled model.
GPU_ARGS ?=
bench-gpu: setup
	$(PY) -m benchmarks.bench_gpu $(GPU_ARGS)

# A DVC experiment: make exp SET="transfer.lr=1e-5 seed=1", make exp PROFILE=paper (profiles/<name>.yaml), or
# both. Its values are checked as check_params checks them before DVC writes any: a refused one changes nothing.
PROFILE ?=
SET ?=
exp: setup
	$(PY) -m stages.profile $(if $(PROFILE),profiles/$(PROFILE).yaml) $(foreach s,$(SET),--set $(s)) --run

# Evaluation throughput against plain sentence-transformers encode, both as whole processes, in one run.
bench-eval: setup
	$(PY) benchmarks/bench_eval.py

# stages.embed with torch fp32, ONNX fp32 and ONNX int8 on the unique STS test sentences, whole processes pinned
# to the same cores, as ratios to torch fp32 (BENCH_EMBED_ARGS="--model DIR --data DIR --threads N").
BENCH_EMBED_ARGS ?=
bench-embed: setup
	$(PY) benchmarks/bench_embed.py $(BENCH_EMBED_ARGS)

# Does a retrain pay on its domain? Test Spearman on seen / unseen / mixed pairs and STS-B dev before/after per
# method, labelled and label-free, wall time, the gate's rule; SICK split by sentence by default (one half as
# text, dev pairs inside it, test pairs split by what each run trained on); --from
# base|champion|DIR; --text --dev --test for any triple. Not part of `make run`; registers nothing.
# make bench-domain BENCH_DOMAIN_ARGS="--method contrastive tsdae tsdae+contrastive --steps 60"
BENCH_DOMAIN_ARGS ?=
bench-domain: setup
	$(VENV)/bin/dvc repro validate
	$(PY) -m benchmarks.bench_domain $(BENCH_DOMAIN_ARGS)

# The paper's analyses (never part of `make run`; they log and register nothing). One target each; the
# training sweeps are short CPU runs by default: ANALYZE_ARGS="--steps 60 --max-texts all" for longer ones.
ANALYSES := space freq-tokens aug-grid few-shot temperature batch-size
ANALYZE_ARGS ?=
analyses: $(addprefix analysis-,$(ANALYSES))
analysis-%: setup
	$(PY) -m stages.analyze $* $(ANALYZE_ARGS)

# One HTML page from metrics/ and plots/: reports/index.html. Through DVC (this stage only), so dvc.lock
# records it and `dvc status` stays clean; it reruns only when a metric, a plot or stages/report.py changed.
report: setup
	$(VENV)/bin/dvc repro --single-item report

# Local servers on 127.0.0.1 (Prefect :4200 + process worker + deployments + inbox watcher, MLflow UI :5000);
# PIDs and logs in .run/. Ports: make serve PREFECT_PORT=4300 MLFLOW_PORT=5100.
serve: setup
	VENV=$(VENV) infra/serve.sh

stop:
	infra/stop.sh

clean:
	rm -rf .pytest_cache .ruff_cache
