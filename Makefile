# flashqla build. `make` needs only a C compiler; when nvcc is found the CUDA
# sources are compiled ahead of time for sm_90a and linked in.
#
#   make            build/libflashqla.a, build/libflashqla.so, build/flashqla
#   make test       all tests (+ ASan/UBSan build of the tests, + a bounded libFuzzer run)
#   make run        flashqla run (the default GDN layer, GPU when present, else CPU)
#   make CUDA=0     force a CPU-only build

CC      ?= cc
CXX     ?= c++
OPT     ?= -O2
CFLAGS  ?= $(OPT) -march=x86-64-v2
BASE_CFLAGS = -std=c99 -Wall -Wextra -pedantic -fPIC -Iinclude -Isrc -pthread -D_POSIX_C_SOURCE=200809L
LDLIBS  = -lm -pthread
BUILD   = build

CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
ifeq ($(CUDA),0)
NVCC :=
endif

C_SRC   = $(wildcard src/*.c src/cpu/*.c)
CU_SRC  =
LINK    = $(CC)
ifneq ($(strip $(NVCC)),)
CU_SRC  = $(wildcard src/cuda/*.cu)
BASE_CFLAGS += -DFQLA_HAVE_CUDA
NVCCFLAGS = -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Iinclude -Isrc \
            -DFQLA_HAVE_CUDA --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills $(NVCC_EXTRA)
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif

OBJ     = $(C_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
LIB_A   = $(BUILD)/libflashqla.a
LIB_SO  = $(BUILD)/libflashqla.so
CLI     = $(BUILD)/flashqla

TEST_SRC = $(wildcard tests/test_*.c)
TESTS    = $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON = $(wildcard tests/common/*.c)
# CUDA unit tests (tests/test_gpu_*.cu, the ptx layer's primitives): built
# with nvcc when it is found; they skip their cases without a device
CU_TEST_SRC = $(if $(strip $(NVCC)),$(wildcard tests/test_gpu_*.cu))
CU_TESTS    = $(CU_TEST_SRC:tests/%.cu=$(BUILD)/tests/%)

CU_TEST_COMMON = $(TEST_COMMON:tests/%.c=$(BUILD)/tests/obj/%.o)
$(BUILD)/tests/obj/%.o: tests/%.c $(wildcard tests/common/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests -c $< -o $@
$(BUILD)/tests/%: tests/%.cu $(CU_TEST_COMMON) $(wildcard tests/common/*.h src/cuda/ptx/*.cuh src/cuda/kernel/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Itests $< $(CU_TEST_COMMON) -o $@

# Sanitizer and fuzzer objects are intermediate files of pattern rules: keep them.
.SECONDARY:

.PHONY: all test test-fast test-asan fuzz run clean
all: $(LIB_A) $(LIB_SO) $(CLI)

$(BUILD)/obj/%.o: %.c $(wildcard include/*.h src/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(wildcard include/*.h src/*.h src/cuda/*.h src/cuda/*.cuh src/cuda/ptx/*.cuh src/cuda/kernel/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@ 2> $@.log || { cat $@.log >&2; rm -f $@; exit 1; }
	@# ptxas's C7511 / C7512 (wgmma serialised: for the wgmma pipeline or
	@# the whole function) are hard regressions for these kernels: docs/perf.md, sessions 18, 26
	@cat $@.log >&2; if grep -qE 'C751[12]' $@.log; then echo "$<: ptxas serialised wgmma (C7511 / C7512)" >&2; rm -f $@; exit 1; fi

$(LIB_A): $(OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(OBJ)
	$(LINK) -shared -o $@ $^ $(LDLIBS)

# The commit the program is built from (+dirty with uncommitted changes; empty
# outside a git checkout), for the records `flashqla bench` writes.
BUILD_COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null)$(shell git rev-parse --git-dir >/dev/null 2>&1 && \
                  { git diff --quiet HEAD -- 2>/dev/null || echo +dirty; })

$(CLI): $(wildcard tools/*.c tools/*.h) $(LIB_A)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -DFQLA_BUILD_COMMIT='"$(BUILD_COMMIT)"' $(wildcard tools/*.c) $(LIB_A) -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(wildcard tests/common/*.h src/cuda/*.h) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests $< $(TEST_COMMON) $(LIB_A) -o $@ $(LDLIBS)

# --- sanitizer build of the library (C sources, CUDA stubbed) and the tests ---
ASAN_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_CFLAGS = -std=c99 -Wall -Wextra -pedantic -Iinclude -Isrc -Itests -pthread -D_POSIX_C_SOURCE=200809L
ASAN_OBJ = $(C_SRC:%.c=$(BUILD)/asan/obj/%.o)
ASAN_TESTS = $(TEST_SRC:tests/%.c=$(BUILD)/asan/tests/%)

$(BUILD)/asan/obj/%.o: %.c $(wildcard include/*.h src/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(BUILD)/asan/tests/%: tests/%.c $(TEST_COMMON) $(ASAN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(ASAN_FLAGS) $< $(TEST_COMMON) $(ASAN_OBJ) -o $@ -lm

# --- libFuzzer over the argument validation (clang only) ---
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 90
FUZZ_OBJ = $(C_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
$(BUILD)/fuzz/obj/%.o: %.c $(wildcard include/*.h src/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(ASAN_CFLAGS) -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -c $< -o $@
$(BUILD)/fuzz/fuzz_validate: fuzz/fuzz_validate.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(ASAN_CFLAGS) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $^ -o $@ -lm

test-fast: $(TESTS) $(CU_TESTS)
	tests/run_tests.sh $(BUILD)/tests

test-asan: $(ASAN_TESTS)
	FQLA_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 tests/run_tests.sh $(BUILD)/asan/tests

fuzz: $(BUILD)/fuzz/fuzz_validate
	@mkdir -p $(BUILD)/fuzz/corpus
	$(BUILD)/fuzz/fuzz_validate -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/fuzz/corpus

test: all $(TESTS) $(CU_TESTS) $(ASAN_TESTS) $(BUILD)/fuzz/fuzz_validate
	tests/run_all.sh $(BUILD) $(FUZZ_SECONDS)

run: $(CLI)
	$(CLI) run

clean:
	rm -rf $(BUILD)
