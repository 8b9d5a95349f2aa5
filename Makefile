# Builds what this machine can build: the CPU targets always, the GPU targets when nvcc exists.
#   make              all targets into build/
#   make test         every test that needs no GPU (also compiles the GPU targets when nvcc exists)
#   make test-gpu     the GPU tests (needs a GPU)
#   make dev          the kernel lab (dev/cuda)
#   make bench        scripts/bench_gpt2.sh (needs a GPU and PyTorch)
# Options: PRECISION=BF16|FP32, GPU_ARCH=90a (any sm number), USE_CUDNN=1, NO_OMP=1
CXX       ?= g++
NVCC      ?= nvcc
BUILD     := build
PRECISION ?= BF16
GPU_ARCH  ?= 90a
# -fno-math-errno: sqrtf/expf never need errno here, and without it GCC vectorizes them (AdamW 4.5x)
CXXFLAGS  := -O3 -march=native -std=c++17 -Wall -Wextra -Wno-unused-parameter -fno-math-errno -I.
LDLIBS    := -lm
ifndef NO_OMP
  CXXFLAGS += -fopenmp
else
  CXXFLAGS += -Wno-unknown-pragmas
endif
# CI and this project's build machine may differ from where binaries run: set NATIVE=0 to drop -march=native
ifeq ($(NATIVE),0)
  CXXFLAGS := $(filter-out -march=native,$(CXXFLAGS))
endif

HAS_NVCC  := $(shell command -v $(NVCC) 2>/dev/null)
NVCCFLAGS := -O3 -std=c++17 -I. --use_fast_math -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) \
             -Xcompiler -fopenmp,-fno-math-errno -DPRECISION_$(PRECISION) -lineinfo
NVLDLIBS  := -lcublas -lcublasLt -lgomp
# sm_90a (Hopper's arch-specific features: wgmma, setmaxnreg) kernels compile only for that target;
# LLMC_SM90A tells the host code they exist
ifeq ($(GPU_ARCH),90a)
  NVCCFLAGS += -DLLMC_SM90A
endif
# cudnn_frontend is header-only: `pip download --no-deps nvidia-cudnn-frontend`, unzip the wheel's include/
# into build/cudnn_frontend/include (or point CUDNN_FRONTEND_PATH elsewhere). It compiles kernels with NVRTC.
CUDNN_FRONTEND_PATH ?= $(BUILD)/cudnn_frontend/include
ifeq ($(USE_CUDNN),1)
  NVCCFLAGS += -DUSE_CUDNN -I$(CUDNN_FRONTEND_PATH)
  NVLDLIBS  += -lcudnn -lnvrtc
endif

CPU_TARGETS := $(BUILD)/train_gpt2_cpu $(BUILD)/test_gpt2_cpu $(BUILD)/test_dataloader $(BUILD)/test_attention_cpu
GPU_TARGETS := $(BUILD)/train_gpt2cu $(BUILD)/test_gpt2cu $(BUILD)/train_gpt2cu_fp32 $(BUILD)/test_gpt2cu_fp32

LLMC_H   := $(wildcard llmc/*.h llmc/cpu/*.h)
LLMC_CUH := $(wildcard llmc/*.cuh) $(LLMC_H)

.PHONY: all cpu gpu test test-cpu test-gpu dev bench clean fixture
all: cpu $(if $(HAS_NVCC),gpu)
cpu: $(CPU_TARGETS)
gpu: $(GPU_TARGETS)

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/%: %.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)
# test_gpt2_cpu.cpp includes the CPU trainer to test its model code
$(BUILD)/test_gpt2_cpu: train_gpt2_cpu.cpp

$(BUILD)/test_dataloader: tests/test_dataloader.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/test_attention_cpu: tests/test_attention_cpu.cpp $(LLMC_H) | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

$(BUILD)/train_gpt2cu: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

$(BUILD)/test_gpt2cu: test_gpt2.cu train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

# The FP32 build of the same code (floatX = float), whatever PRECISION says: the tight-tolerance twin.
$(BUILD)/test_gpt2cu_fp32: test_gpt2.cu train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(filter-out -DPRECISION_%,$(NVCCFLAGS)) -DPRECISION_FP32 $< -o $@ $(NVLDLIBS)
$(BUILD)/train_gpt2cu_fp32: train_gpt2.cu $(LLMC_CUH) | $(BUILD)
	$(NVCC) $(filter-out -DPRECISION_%,$(NVCCFLAGS)) -DPRECISION_FP32 $< -o $@ $(NVLDLIBS)

# Every test that needs no GPU; prints "N passed, N failed" last and fails if any failed.
test: cpu $(if $(HAS_NVCC),gpu dev)
	@./tests/run_tests.sh

test-gpu: gpu
	@./tests/run_gpu_tests.sh

dev:
	$(MAKE) -C dev/cuda

bench: gpu
	./scripts/bench_gpt2.sh

# Regenerates the committed CPU test fixtures (needs torch): tests/fixture/model.bin + debug.bin
# (multi-head) and gqa_model.bin + gqa_debug.bin (NH=6, NKV=2, window 6), see README.md
fixture:
	python3 scripts/train_gpt2.py --fixture tests/fixture

clean:
	rm -rf $(BUILD)
	$(MAKE) -C dev/cuda clean
