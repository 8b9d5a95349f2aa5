# build.mk: the CUDA build settings, written once. The top Makefile and dev/cuda/Makefile include it,
# so the trainer, the tests and the kernel lab always compile with the same flags.
# Options: PRECISION=BF16|FP32, GPU_ARCH=90a (one sm number, a list, or all; below)

# The repository root as seen from the including Makefile ("." at the top, "../.." from dev/cuda):
# read before anything else is included, while this file is the last one in MAKEFILE_LIST.
LLMC_ROOT := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

NVCC      ?= nvcc
PRECISION ?= BF16
GPU_ARCH  ?= 90a
HAS_NVCC  := $(shell command -v $(NVCC) 2>/dev/null)

# GPU_ARCH: the machine code to build. One architecture (90a: H100/H200 with the Hopper kernels; 80:
# A100; 86: RTX 30xx, A40; 89: RTX 40xx, L4, L40; 100: B200; 120: RTX 50xx) gives its SASS only. A
# list, oldest first ("80 90a"), or all (GPU_ARCHS_ALL) gives a fat binary: the SASS of each, plus
# the PTX of the last one (unless it is an arch-specific 90a) for GPUs newer than all of them.
# GPU_ARCH_PTX=80 (with GPU_ARCH=80) adds compute_80's PTX to a one-arch build: an H100 or H200 then
# JIT-compiles it at the first launch and runs the portable kernels as an A100 would.
GPU_ARCHS_ALL := 80 86 89 90a 100 120
GPU_ARCH_LIST := $(if $(filter all,$(GPU_ARCH)),$(GPU_ARCHS_ALL),$(GPU_ARCH))
GPU_ARCH_PTX  := $(if $(word 2,$(GPU_ARCH_LIST)),$(filter-out %a,$(lastword $(GPU_ARCH_LIST))))
# -gencode flags for the architectures $(1), with the PTX of $(2) (one of them, or empty)
comma := ,
GENCODE = $(foreach a,$(1),-gencode arch=compute_$(a),code=$(if $(filter $(a),$(2)),[sm_$(a)$(comma)compute_$(a)],sm_$(a)))

NVCCFLAGS := -O3 -std=c++17 -I$(LLMC_ROOT) --use_fast_math $(call GENCODE,$(GPU_ARCH_LIST),$(GPU_ARCH_PTX)) \
             -Xcompiler -fopenmp,-fno-math-errno -DPRECISION_$(PRECISION) -lineinfo
NVLDLIBS  := -lcublas -lcublasLt -lgomp
# The Hopper kernels (wgmma, setmaxnreg, TMA tensor copies: llmc/attention_hopper*.cuh) need sm_90a's
# arch-specific features. LLMC_SM90A says the build has their sm_90a machine code; their device code
# is empty for the other architectures of a list, and the host runs them only on a 9.0 GPU
# (llmc/cuda_common.cuh, device_runs_sm90a).
ifneq ($(filter 90a,$(GPU_ARCH_LIST)),)
  NVCCFLAGS += -DLLMC_SM90A
endif
# NCCL (data parallel, llmc/model_dist.cuh): its header beside nvcc's, in /usr/include, or under NCCL_HOME
NCCL_H := $(firstword $(wildcard $(if $(HAS_NVCC),$(dir $(realpath $(HAS_NVCC)))../include/nccl.h) /usr/include/nccl.h \
                                 /usr/local/cuda/include/nccl.h $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h)))
NCCL_FLAGS := -DLLMC_NCCL $(if $(NCCL_HOME),-I$(NCCL_HOME)/include -L$(NCCL_HOME)/lib)

# Registers and spills per kernel. PTXAS_REPORT compiles device code only (no host compile, no link)
# with `ptxas -v`, keeping its report:  $(call PTXAS_REPORT,file.cu,out.ptxas)
# PTXAS_TABLE prints such a report as one line per kernel, the spilling ones first, then by registers:
#   $(call PTXAS_TABLE,out.ptxas)  ->  registers | stack bytes | spill stores | spill loads | kernel (demangled)
PTXAS_REPORT = $(NVCC) $(NVCCFLAGS) -cubin -Xptxas -v $(1) -o $(basename $(2)).cubin 2> $(2) \
               || { cat $(2); rm -f $(2); exit 1; }
PTXAS_TABLE  = awk '/Compiling entry function/ { split($$0, q, "'\''"); kernel = q[2] } \
               /bytes stack frame/ { stack = $$1; stores = $$5; loads = $$9 } \
               /Used [0-9]+ registers/ { for (i = 1; i < NF; i++) if ($$i == "Used") regs = $$(i + 1); \
                   printf "%d %d %9d | %11d | %12d | %11d | %s\n", stores + loads, regs, regs, stack, stores, loads, kernel }' $(1) \
               | sort -k1,1nr -k2,2nr | cut -d' ' -f3- | c++filt \
               | { printf '%9s | %11s | %12s | %11s | %s\n' registers "stack bytes" "spill stores" "spill loads" kernel; cat; }
