# build.mk: the CUDA build settings, written once. The top Makefile and dev/cuda/Makefile include it,
# so the trainer, the tests and the kernel lab always compile with the same flags.
# Options: PRECISION=BF16|FP32, GPU_ARCH=90a (any sm number), USE_CUDNN=1 (with CUDNN_FRONTEND_PATH)

# The repository root as seen from the including Makefile ("." at the top, "../.." from dev/cuda):
# read before anything else is included, while this file is the last one in MAKEFILE_LIST.
LLMC_ROOT := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

NVCC      ?= nvcc
PRECISION ?= BF16
GPU_ARCH  ?= 90a
HAS_NVCC  := $(shell command -v $(NVCC) 2>/dev/null)

NVCCFLAGS := -O3 -std=c++17 -I$(LLMC_ROOT) --use_fast_math -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) \
             -Xcompiler -fopenmp,-fno-math-errno -DPRECISION_$(PRECISION) -lineinfo
NVLDLIBS  := -lcublas -lcublasLt -lgomp
# sm_90a (Hopper's arch-specific features: wgmma, setmaxnreg) kernels compile only for that target;
# LLMC_SM90A tells the host code they exist
ifeq ($(GPU_ARCH),90a)
  NVCCFLAGS += -DLLMC_SM90A
endif
# NCCL (data parallel, llmc/gpt2_dist.cuh): its header beside nvcc's, in /usr/include, or under NCCL_HOME
NCCL_H := $(firstword $(wildcard $(if $(HAS_NVCC),$(dir $(realpath $(HAS_NVCC)))../include/nccl.h) /usr/include/nccl.h \
                                 /usr/local/cuda/include/nccl.h $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h)))
NCCL_FLAGS := -DLLMC_NCCL $(if $(NCCL_HOME),-I$(NCCL_HOME)/include -L$(NCCL_HOME)/lib)
# cudnn_frontend is header-only: scripts/get_cudnn_frontend.sh puts the headers in
# build/cudnn_frontend/include (or point CUDNN_FRONTEND_PATH elsewhere). It compiles kernels with NVRTC.
CUDNN_FRONTEND_PATH ?= $(abspath $(LLMC_ROOT)/build/cudnn_frontend/include)
ifeq ($(USE_CUDNN),1)
  NVCCFLAGS += -DUSE_CUDNN -I$(CUDNN_FRONTEND_PATH)
  NVLDLIBS  += -lcudnn -lnvrtc
endif

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
