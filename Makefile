# crossfuse: the two commands of the quick start.
#   make run   - set up .venv, run the correctness suite and a small comparison table
#   make test  - set up .venv, run the linters and the test-suite (what CI runs)
# On a machine without a GPU, Triton kernels run under Triton's interpreter.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the torch the venv installs: PyPI's build (with CUDA on Linux); TORCH_SPEC=... picks another one
TORCH_SPEC ?= torch==2.13.0
OUT ?= out

.PHONY: run test lint clean FORCE

# the torch spec the venv was set up with: another one (TORCH_SPEC=... make run) sets it up again
$(BIN)/.torch-spec: FORCE
	@mkdir -p $(BIN)
	@echo '$(TORCH_SPEC)' | cmp -s - $@ || echo '$(TORCH_SPEC)' > $@

$(BIN)/.installed: pyproject.toml $(BIN)/.torch-spec
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/crossfuse info
	$(BIN)/crossfuse check
	$(BIN)/crossfuse bench layer_norm --quick --out $(OUT)/quick --replace

lint: $(BIN)/.installed
	$(BIN)/ruff check python bridge tests bench
	$(BIN)/fatou lint julia bench/julia bridge
	$(BIN)/fatou format --check julia bench/julia bridge

test: lint
	$(BIN)/pytest -q -n auto --maxprocesses 4

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache

# The Julia side, for a user with Julia (1.10.3 or newer) on PATH: the Julia package's own tests, then
# the cross-language suite through juliacall with the Julia side required (CROSSFUSE_JULIA=1: a Julia
# that cannot be used fails the suite instead of skipping it). CI runs the same targets.
JULIA ?= julia

.PHONY: julia-test julia-pkg-test julia-cross-test julia-test-cuda

julia-test: julia-pkg-test julia-cross-test

julia-pkg-test:
	$(JULIA) --project=julia -e 'using Pkg; Pkg.instantiate(); Pkg.test()'

julia-cross-test: $(BIN)/.installed
	$(BIN)/python -m pip install -q -e '.[julia]'
	PYTHON_JULIAPKG_EXE="$$(command -v $(JULIA))" CROSSFUSE_JULIA=1 \
		$(BIN)/pytest -q -rs tests/test_cross_language.py

# CrossFuse's CUDA tests in their own environment (julia/test/cuda; Julia 1.11 or newer), on a GPU machine
julia-test-cuda:
	$(JULIA) --project=julia/test/cuda -e 'using Pkg; Pkg.instantiate()'
	$(JULIA) --project=julia/test/cuda julia/test/cuda/runtests.jl
