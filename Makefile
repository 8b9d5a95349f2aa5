# Builds what this machine can build: the CPU targets always, the GPU targets when nvcc exists.
#   make                all targets into build/
#   make test           every test that needs no GPU, after the CPU build, the header and architecture
#                       checks and build/train_gpt2cu (JOBS jobs, default the core count); phases timed
#   make test-gpu       the GPU tests (needs a GPU; QUICK=1 one case a section, SECTIONS=16 sections 1 and 6)
#   make dev            the kernel lab (dev/cuda; see its Makefile for spills, sass, one lab)
#   make check-headers  every llmc/ header compiles on its own (g++, and nvcc when it exists)
#   make check-arch     every GPU program and lab file compiles for each architecture (nvcc's front end)
#   make spills         registers and spills of every trainer kernel (ptxas -v); the lab's: make -C dev/cuda spills
#   make sass           the trainer's machine code into build/train_gpt2cu.sass
#   make bench          scripts/bench_train.sh (needs a GPU and PyTorch)
# Options: PRECISION=BF16|FP32, GPU_ARCH=90a (any sm number), NO_OMP=1, NATIVE=0, USE_MPI=1 (also
#          build/train_gpt2cu_mpi, the NCCL trainer for mpirun), NCCL_HOME=DIR (NCCL outside the CUDA toolkit)
# The CUDA flags live in build.mk, shared with dev/cuda/Makefile.
include build.mk
CXX       ?= g++
BUILD     := build
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
# -fno-math-errno: sqrtf/expf never need errno here, and without it GCC vectorizes them (AdamW 4.5x)
CXXFLAGS  := -O3 -march=native -std=c++17 -Wall -Wextra -Wno-unused-parameter -fno-math-errno -I.
LDLIBS    := -lm
ifndef NO_OMP
  CXXFLAGS += -fopenmp
else
  CXXFLAGS += -Wno-unknown-pragmas
endif
# NATIVE=0: binaries for other machines of this ISA. On x86-64 that is x86-64-v3 (AVX2, FMA: any x86-64
# CPU since 2013-2015), whose programs refuse with one line to start on an older CPU (llmc/cpu/isa_check.h);
# elsewhere the compiler's default for the target. The default (-march=native) is for this machine.
ifeq ($(NATIVE),0)
  CXXFLAGS := $(filter-out -march=native,$(CXXFLAGS)) $(if $(filter x86_64,$(shell uname -m)),-march=x86-64-v3)
endif

CPU_TARGETS := $(BUILD)/train_gpt2_cpu $(BUILD)/generate_cpu $(BUILD)/test_gpt2_cpu $(BUILD)/test_dataloader $(BUILD)/test_attention_cpu \
               $(BUILD)/test_llama_ops_cpu $(BUILD)/test_attention_decode_cpu $(BUILD)/test_bpe \
               $(BUILD)/test_generate_cpu $(BUILD)/test_zero $(BUILD)/test_fp8_cpu $(BUILD)/test_muon_cpu
# The CPU trainer over MPI (data parallel, llmc/dist_mpi.h), when mpicxx exists; the plain one links no MPI.
MPICXX     ?= mpicxx
HAS_MPICXX := $(shell command -v $(MPICXX) 2>/dev/null)
ifneq ($(HAS_MPICXX),)
  CPU_TARGETS += $(BUILD)/train_gpt2_cpu_mpi
endif
GPU_TARGETS := $(BUILD)/train_gpt2cu $(BUILD)/test_gpt2cu $(BUILD)/train_gpt2cu_fp32 $(BUILD)/test_gpt2cu_fp32 \
               $(BUILD)/generate $(BUILD)/generate_fp32 $(BUILD)/test_fp8_gpu

# The GPU trainer with NCCL data parallel (llmc/model_dist.cuh), when NCCL's header is found (build.mk)
# (build/train_gpt2cu_nccl; its ranks meet by --dist-init tcp/file/env); build/train_gpt2cu_mpi is the
# same with MPI for mpirun (make USE_MPI=1, or by name), from mpicxx's flags (OpenMPI's --showme).
# (build/train_gpt2cu_mpi: the same with MPI, for mpirun; built by make USE_MPI=1 or by name.)
ifneq ($(NCCL_H),)
  GPU_TARGETS += $(BUILD)/train_gpt2cu_nccl $(if $(filter 1,$(USE_MPI)),$(BUILD)/train_gpt2cu_mpi)
endif
MPI_FLAGS   = -DLLMC_MPI $(shell $(MPICXX) --showme:compile) $(shell $(MPICXX) --showme:link)

LLMC_H   := $(wildcard llmc/*.h llmc/cpu/*.h)
LLMC_CUH := $(wildcard llmc/*.cuh) $(LLMC_H)

.PHONY: all cpu gpu test test-build test-gpu-compile test-gpu dev check-headers check-arch check-cpu-compilers spills sass bench clean fixture
all: cpu $(if $(HAS_NVCC),gpu)
cpu: $(CPU_TARGETS)
gpu: $(GPU_TARGETS)

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/%: %.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/train_gpt2_cpu_mpi: train_gpt2_cpu.cpp $(LLMC_H) | $(BUILD)
	$(MPICXX) $(CXXFLAGS) -DLLMC_MPI $< -o $@ $(LDLIBS)

$(BUILD)/test_dataloader: tests/cpu/test_dataloader.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_attention_cpu: tests/cpu/test_attention.cpp tests/cpu/fixture_check.h $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_llama_ops_cpu: tests/cpu/test_llama_ops.cpp tests/cpu/fixture_check.h $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_attention_decode_cpu: tests/cpu/test_attention_decode.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_zero: tests/cpu/test_zero.cpp tests/cpu/check.h $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_fp8_cpu: tests/cpu/test_fp8.cpp tests/cpu/check.h $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_muon_cpu: tests/cpu/test_muon.cpp tests/cpu/fixture_check.h $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_bpe: tests/cpu/test_bpe.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_generate_cpu: tests/cpu/test_generate.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/train_gpt2cu: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

$(BUILD)/train_gpt2cu_nccl: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $(NCCL_FLAGS) $< -o $@ $(NVLDLIBS) -lnccl
$(BUILD)/train_gpt2cu_mpi: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	@command -v $(MPICXX) >/dev/null || { echo "$@: needs MPI (mpicxx not found; apt-get install libopenmpi-dev)"; exit 1; }
	$(NVCC) $(NVCCFLAGS) $(NCCL_FLAGS) $(MPI_FLAGS) $< -o $@ $(NVLDLIBS) -lnccl

$(BUILD)/test_gpt2cu: test_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

# The FP8 linear layers of --fp8 against the CPU reference (bf16 build only: the FP8 matmuls write bf16)
$(BUILD)/test_fp8_gpu: tests/gpu/test_fp8.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(filter-out -DPRECISION_%,$(NVCCFLAGS)) -DPRECISION_BF16 $< -o $@ $(NVLDLIBS)

$(BUILD)/generate: generate.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

# The FP32 build of the same code (floatX = float), whatever PRECISION says: the tight-tolerance twin.
$(BUILD)/test_gpt2cu_fp32: test_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(filter-out -DPRECISION_%,$(NVCCFLAGS)) -DPRECISION_FP32 $< -o $@ $(NVLDLIBS)
$(BUILD)/train_gpt2cu_fp32: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(filter-out -DPRECISION_%,$(NVCCFLAGS)) -DPRECISION_FP32 $< -o $@ $(NVLDLIBS)
$(BUILD)/generate_fp32: generate.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(filter-out -DPRECISION_%,$(NVCCFLAGS)) -DPRECISION_FP32 $< -o $@ $(NVLDLIBS)

# Every test that needs no GPU, in three timed phases (tests/make_test.sh prints each one's seconds
# last and fails if any failed; each phase runs JOBS compiles at a time and keeps going past an error):
#   build  the CPU programs and tests, every llmc/ header on its own, the CPU trainer under clang++ and
#          the aarch64 cross compiler (make test-build)
#   gpu    build/check/train_gpt2cu (its flag checks run without a GPU) beside make check-arch: every GPU
#          program and lab file through nvcc's front end for each architecture (make test-gpu-compile)
#   run    tests/run_tests.sh: the suites, "N passed, N failed" last
# Without nvcc the gpu phase is skipped, saying so. `make gpu` and `make dev` build the rest.
test:
	@MAKE="$(MAKE)" JOBS=$(JOBS) HAS_NVCC="$(HAS_NVCC)" ./tests/make_test.sh
test-build: cpu check-headers check-cpu-compilers
test-gpu-compile: $(BUILD)/check/train_gpt2cu check-arch
# make test's GPU trainer: the same program compiled in a fifth of the time (no optimizer, PTX only, for
# the driver to compile on a GPU), for tests/cpu/test_bad_inputs.sh's flag checks that run without one
$(BUILD)/check/train_gpt2cu: train_gpt2.cu $(LLMC_CUH)
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -O3 -gencode arch=%,$(NVCCFLAGS)) -DLLMC_SM90A -O0 -Xcompiler -O0 -Xcicc -O0 \
	    -gencode arch=compute_90a,code=compute_90a $< -o $@ $(NVLDLIBS)

test-gpu: gpu $(BUILD)/generate_cpu $(BUILD)/train_gpt2_cpu
	@QUICK="$(QUICK)" SECTIONS="$(SECTIONS)" ./tests/run_gpu_tests.sh

dev:
	$(MAKE) -C dev/cuda

# The CPU programs under the other compilers a user may have, each where it is installed: clang++ builds
# the trainer (build/clang/), and the aarch64 cross compiler checks the trainer and generate_cpu
# (-fsyntax-only: the whole front end, templates included; no aarch64 libraries needed). Neither installed: passes, saying so.
CLANGXX       ?= clang++
CROSS_AARCH64 ?= aarch64-linux-gnu-g++
HAS_CLANGXX   := $(shell command -v $(CLANGXX) 2>/dev/null)
HAS_CROSS     := $(shell command -v $(CROSS_AARCH64) 2>/dev/null)
CPU_PORTABLE  := $(if $(HAS_CLANGXX),$(BUILD)/clang/train_gpt2_cpu) \
                 $(if $(HAS_CROSS),$(BUILD)/aarch64/train_gpt2_cpu.o $(BUILD)/aarch64/generate_cpu.o)
check-cpu-compilers: $(CPU_PORTABLE)
	@echo "check-cpu-compilers: $(if $(HAS_CLANGXX),clang++ built the CPU trainer,no clang++)$(comma) \
	$(if $(HAS_CROSS),$(CROSS_AARCH64) checked the CPU programs,no aarch64 cross compiler)"
$(BUILD)/clang/%: %.cpp $(LLMC_H)
	@mkdir -p $(dir $@)
	$(CLANGXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)
$(BUILD)/aarch64/%.o: %.cpp $(LLMC_H)
	@mkdir -p $(dir $@)
	$(CROSS_AARCH64) $(filter-out -march=native,$(CXXFLAGS)) -fsyntax-only $< && touch $@

# Each llmc/ header compiles on its own, from a one-line file that includes it: the .h files with
# g++ -fsyntax-only, the .cuh files through nvcc's front end (-cuda -fdevice-syntax-only: no host compile).
# A stamp per header under build/headers/ skips the unchanged ones.
HEADERS       := $(LLMC_H) $(if $(HAS_NVCC),$(wildcard llmc/*.cuh))
HEADER_STAMPS := $(addprefix $(BUILD)/headers/,$(addsuffix .ok,$(HEADERS)))
check-headers:
	@$(MAKE) --no-print-directory -s -k $(HEADER_STAMPS) || { echo "check-headers: these llmc/ headers do not compile on their own:" \
	    $(foreach h,$(HEADERS),$$([ -f $(BUILD)/headers/$(h).ok ] || echo $(h))); exit 1; }
	@echo "check-headers: $(words $(HEADERS)) llmc/ headers compile on their own$(if $(HAS_NVCC),, (no nvcc: .h files only))"

# On failure: the first lines of the compiler's output, the whole of it in build/headers/<header>.log
HEADER_FAIL = { echo "check-headers: FAIL $< (its first errors; all of the output in $(@:.ok=.log))"; \
                grep -m 6 -E 'error|Error' $(@:.ok=.log) | sed 's/^/    /'; exit 1; }
$(BUILD)/headers/%.h.ok: %.h $(LLMC_CUH)
	@mkdir -p $(dir $@)
	@echo '#include "$<"' | $(CXX) $(CXXFLAGS) -fsyntax-only -x c++ - > $(@:.ok=.log) 2>&1 || $(HEADER_FAIL)
	@touch $@

# -fdevice-syntax-only (newer nvcc) stops device code after the front end; older ones compile it all
DEVICE_SYNTAX_ONLY = $(shell $(NVCC) --help 2>/dev/null | grep -q fdevice-syntax-only && echo -fdevice-syntax-only)
$(BUILD)/headers/%.cuh.ok: %.cuh $(LLMC_CUH)
	@mkdir -p $(dir $@)
	@echo '#include "$<"' > $(BUILD)/headers/$*.cu
	@$(NVCC) $(NVCCFLAGS) $(DEVICE_SYNTAX_ONLY) -cuda $(BUILD)/headers/$*.cu -o $(BUILD)/headers/$*.ii > $(@:.ok=.log) 2>&1 || $(HEADER_FAIL)
	@touch $@

# Every GPU program and lab file (the NCCL trainer too, when NCCL's header is found) compiles for each
# architecture of a fat build (CHECK_ARCHS, by default build.mk's GPU_ARCHS_ALL, with LLMC_SM90A as
# GPU_ARCH=all sets it): each (architecture, file) is one nvcc run of the device front end only
# (-fdevice-syntax-only -ptx: no host compile, no optimizer, no ptxas). It catches what the
# preprocessor and the C++ front end see: a declaration a CUDA header makes only for newer GPUs, a
# call an architecture guard should have kept out. Not an inline-asm instruction an architecture
# lacks: only ptxas refuses those (a full build for that GPU_ARCH does). A stamp per pair under
# build/arch/ skips the unchanged ones.
# The lab files, whose own code differs little between architectures, are checked for the oldest, the
# Hopper and the newest (CHECK_ARCHS_LAB) to keep make test within its budget.
CHECK_ARCHS     ?= $(GPU_ARCHS_ALL)
CHECK_ARCHS_LAB ?= $(filter 80 90a 120,$(CHECK_ARCHS))
ARCH_UNITS      := train_gpt2.cu test_gpt2.cu generate.cu $(wildcard tests/*.cu tests/gpu/*.cu) $(if $(NCCL_H),train_gpt2.cu.nccl)
ARCH_LAB_UNITS  := $(wildcard dev/cuda/*.cu)
ARCH_STAMPS := $(foreach a,$(CHECK_ARCHS),$(addprefix $(BUILD)/arch/$(a)/,$(addsuffix .ok,$(ARCH_UNITS)))) \
               $(foreach a,$(CHECK_ARCHS_LAB),$(addprefix $(BUILD)/arch/$(a)/,$(addsuffix .ok,$(ARCH_LAB_UNITS))))
ARCH_FLAGS  := $(filter-out -gencode arch=% -DLLMC_SM90A,$(NVCCFLAGS)) -DLLMC_SM90A $(DEVICE_SYNTAX_ONLY) -ptx
ARCH_DEPS   := $(LLMC_CUH) $(wildcard dev/cuda/*.cuh tests/*.h tests/gpu/*.h)
check-arch:
	@$(if $(HAS_NVCC),,echo "check-arch: no nvcc, nothing checked"; exit 0;) \
	$(MAKE) --no-print-directory -s -k $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(JOBS)) $(ARCH_STAMPS) \
	    || { echo "check-arch: these do not compile:"; for s in $(ARCH_STAMPS); do [ -f $$s ] || echo "    $$s" \
	         | sed 's|$(BUILD)/arch/\([^/]*\)/\(.*\)\.ok|sm_\1 \2|'; done; exit 1; }
	@$(if $(HAS_NVCC),echo "check-arch: $(words $(ARCH_UNITS)) programs compile (device front end) for sm_$(subst \
	    $(space),$(comma) sm_,$(strip $(CHECK_ARCHS))) and $(words $(ARCH_LAB_UNITS)) lab files for sm_$(subst \
	    $(space),$(comma) sm_,$(strip $(CHECK_ARCHS_LAB)))")
space := $(subst ,, )
# A stamp's architecture and file: build/arch/<arch>/<file>.ok (<file>.nccl.ok: with NCCL_FLAGS).
# On failure: the first errors, the whole output in build/arch/<arch>/<file>.log
ARCH_OF     = $(firstword $(subst /, ,$(patsubst $(BUILD)/arch/%,%,$@)))
ARCH_FAIL   = { echo "check-arch: FAIL $(patsubst $(BUILD)/arch/$(ARCH_OF)/%.ok,%,$@) for sm_$(ARCH_OF) (its first \
                errors; all of the output in $(@:.ok=.log))"; grep -m 6 -E 'error|Error' $(@:.ok=.log) | sed 's/^/    /'; exit 1; }
ARCH_RECIPE = @mkdir -p $(dir $@) && { $(NVCC) $(ARCH_FLAGS) $(if $(filter %.nccl.ok,$@),$(NCCL_FLAGS)) -arch=compute_$(ARCH_OF) \
                $< -o /dev/null > $(@:.ok=.log) 2>&1 || $(ARCH_FAIL); } && touch $@
define ARCH_RULES
$(BUILD)/arch/$(1)/%.ok: % $(ARCH_DEPS) ; $$(ARCH_RECIPE)
$(BUILD)/arch/$(1)/%.nccl.ok: % $(ARCH_DEPS) ; $$(ARCH_RECIPE)
endef
$(foreach a,$(CHECK_ARCHS),$(eval $(call ARCH_RULES,$(a))))

# ptxas's report of the trainer (device code only), then one line per kernel: registers, spills.
spills: $(BUILD)/train_gpt2cu.ptxas
	@echo "== train_gpt2.cu ($(PRECISION), sm_$(GPU_ARCH))"
	@$(call PTXAS_TABLE,$<)
$(BUILD)/train_gpt2cu.ptxas: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(call PTXAS_REPORT,$<,$@)

# The trainer's machine code, demangled, for reading a kernel's inner loop.
CUOBJDUMP ?= $(firstword $(wildcard $(dir $(HAS_NVCC))cuobjdump) cuobjdump)
sass: $(BUILD)/train_gpt2cu
	@command -v $(CUOBJDUMP) >/dev/null || { echo "make sass: cuobjdump not found (it comes with the CUDA toolkit)"; exit 1; }
	$(CUOBJDUMP) -sass $< | c++filt > $(BUILD)/train_gpt2cu.sass
	@echo "wrote $(BUILD)/train_gpt2cu.sass"

bench: gpu
	./scripts/bench_train.sh

# Regenerates the committed CPU test fixtures (needs torch): tests/fixture/model.bin + debug.bin
# (multi-head) and gqa_model.bin + gqa_debug.bin (NH=6, NKV=2, window 6), and the Llama-style
# llama_, llama_gqa_ and llama_window_ pairs, see README.md (the GPT-2 ones come out byte-identical)
fixture:
	python3 scripts/train_gpt2.py --fixture tests/fixture

clean:
	rm -rf $(BUILD)
	$(MAKE) -C dev/cuda clean
