# flashqla build. `make` needs only a C compiler; when nvcc is found the CUDA
# sources are compiled ahead of time for sm_90a and linked in.
#
#   make            build/libflashqla.a, build/libflashqla.so, build/flashqla
#   make test       all tests (+ the exported-symbols check, + ASan/UBSan build of the
#                   tests, + a bounded libFuzzer run)
#   make run        make, then flashqla run (the default GDN layer, GPU when present, else CPU)
#   make CUDA=0     force a CPU-only build
#   make install PREFIX=/usr/local   the header, both libraries and lib/pkgconfig/flashqla.pc
#                   (DESTDIR honoured); make uninstall PREFIX=... removes them
#
# The build follows its configuration: the compilers, their flags, the CUDA
# switch and DEV are written to stamp files in $(BUILD) (config-c.stamp,
# config-cu.stamp, config-link.stamp), each rewritten only when its part
# changes, and the objects, libraries and programs depend on the parts that
# decide them, so `make` then `make CUDA=0` (or other CFLAGS) in the same
# folder rebuilds what they affect (and `make` again reuses the CUDA objects).
#   make DEV=1      the developer build, in build-dev/: FQLA_DEV defined for C and
#                   CUDA, the tuning kernels compiled, and the library sources of
#                   src/dev/ added (the default build never reads src/dev/)

.DEFAULT_GOAL := all

# The version's one source: VERSION (MAJOR.MINOR.PATCH), also read by setup.py.
VERSION_STRING := $(strip $(file <VERSION))
VERSION_PARTS  := $(subst ., ,$(VERSION_STRING))
VERSION_DEFS    = -DFQLA_VERSION_MAJOR=$(word 1,$(VERSION_PARTS)) -DFQLA_VERSION_MINOR=$(word 2,$(VERSION_PARTS)) \
                  -DFQLA_VERSION_PATCH=$(word 3,$(VERSION_PARTS))

CC      ?= cc
CXX     ?= c++
OPT     ?= -O2
CFLAGS  ?= $(OPT) -march=x86-64-v2
# Symbols are hidden unless marked FQLA_API (include/flashqla.h): the shared
# library exports the public API only.
BASE_CFLAGS = -std=c99 -Wall -Wextra -pedantic -fPIC -fvisibility=hidden -Iinclude -Isrc -pthread -D_POSIX_C_SOURCE=200809L \
              $(VERSION_DEFS)
LDLIBS  = -lm -pthread
# Nothing of the archives linked into libflashqla.so (the static CUDA runtime)
# is exported from it.
SO_LDFLAGS = -Wl,--exclude-libs,ALL

# The developer build keeps its objects apart from the product build's.
DEV     ?= 0
ifeq ($(DEV),1)
BUILD   = build-dev
else
BUILD   = build
endif

CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
ifeq ($(CUDA),0)
NVCC :=
endif

# The product library's C sources: the sanitizer and fuzzer builds use these
# (CUDA stubbed) in every build.
PROD_C_SRC = $(wildcard src/*.c src/cpu/*.c)
C_SRC   = $(PROD_C_SRC)
CU_SRC  =
DEV_HDR =
LINK    = $(CC)
ifneq ($(strip $(NVCC)),)
CU_SRC  = $(wildcard src/cuda/*.cu)
BASE_CFLAGS += -DFQLA_HAVE_CUDA
NVCCFLAGS = -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Xcompiler -fvisibility=hidden \
            -Iinclude -Isrc -DFQLA_HAVE_CUDA --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills $(VERSION_DEFS) $(NVCC_EXTRA)
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
LDLIBS  += $(CUDA_LIBS)
endif

ifeq ($(DEV),1)
C_SRC   += $(wildcard src/dev/*.c)
DEV_HDR  = $(wildcard src/dev/*.h src/dev/*.cuh)
BASE_CFLAGS += -DFQLA_DEV
ifneq ($(strip $(NVCC)),)
CU_SRC  += $(wildcard src/dev/*.cu)
NVCCFLAGS += -DFQLA_DEV -DFQLA_FWD_TUNING=1
endif
endif

# --- the configuration stamps ---
# What decides the C objects and programs, the CUDA objects, and the link. A
# stamp is rewritten (at parse time) only when its string differs from its
# content, so an unchanged configuration rebuilds nothing. The CUDA stamp is
# left alone by a build without CUDA (its objects are not used there).
C_CONFIG    = version=$(VERSION_STRING) dev=$(DEV) cc=$(CC) cflags=$(CFLAGS) base=$(BASE_CFLAGS)
CU_CONFIG   = version=$(VERSION_STRING) dev=$(DEV) nvcc=$(NVCC) nvccflags=$(NVCCFLAGS)
LINK_CONFIG = link=$(LINK) cuda=$(if $(strip $(NVCC)),1,0) ldlibs=$(LDLIBS) so_ldflags=$(SO_LDFLAGS)
C_STAMP     = $(BUILD)/config-c.stamp
CU_STAMP    = $(BUILD)/config-cu.stamp
LINK_STAMP  = $(BUILD)/config-link.stamp
# $(call write_stamp,FILE,STRING): FILE := STRING unless it holds it already
write_stamp = $(if $(subst x$(strip $(2))x,,x$(strip $(file <$(1)))x),$(shell mkdir -p $(BUILD))$(file >$(1),$(strip $(2))))
ifneq ($(filter-out clean uninstall,$(or $(MAKECMDGOALS),all)),)
$(call write_stamp,$(C_STAMP),$(C_CONFIG))
$(call write_stamp,$(LINK_STAMP),$(LINK_CONFIG))
ifneq ($(strip $(NVCC)),)
$(call write_stamp,$(CU_STAMP),$(CU_CONFIG))
endif
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
$(BUILD)/tests/obj/%.o: tests/%.c $(wildcard tests/common/*.h) $(C_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests -c $< -o $@
$(BUILD)/tests/%: tests/%.cu $(CU_TEST_COMMON) $(wildcard tests/common/*.h src/cuda/ptx/*.cuh src/cuda/kernel/*.cuh) $(CU_STAMP) $(C_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Itests $< $(CU_TEST_COMMON) -o $@

# The objects built by pattern rules are named as prerequisites of explicit
# rules here, so none is an intermediate file: make neither deletes them after
# a build nor skips one that is missing.
$(CU_TESTS): $(CU_TEST_COMMON)

.PHONY: all test test-fast test-asan test-aarch64 fuzz run clean install uninstall
all: $(LIB_A) $(LIB_SO) $(CLI)

$(BUILD)/obj/%.o: %.c $(wildcard include/*.h src/*.h src/cpu/*.h) $(DEV_HDR) $(C_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(wildcard include/*.h src/*.h src/cuda/*.h src/cuda/*.cuh src/cuda/ptx/*.cuh src/cuda/kernel/*.cuh) $(DEV_HDR) $(CU_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@ 2> $@.log || { cat $@.log >&2; rm -f $@; exit 1; }
	@# ptxas's C7511 / C7512 (wgmma serialised, for the wgmma pipeline or the
	@# whole function) are hard regressions for these kernels: a build whose
	@# chain kernels had C7511 ran x1.13 slower (x1.05-1.34) over the 36
	@# uniform rows on the H200, so the object is rejected; the developer
	@# build's experiments (src/dev/) are kept with the message, and timed as such
	@cat $@.log >&2; if grep -qE 'C751[12]' $@.log; then case $< in \
	  src/dev/*) echo "$<: ptxas serialised wgmma (C7511 / C7512): kept, a developer-build experiment" >&2 ;; \
	  *) echo "$<: ptxas serialised wgmma (C7511 / C7512)" >&2; rm -f $@; exit 1 ;; esac; fi

$(LIB_A): $(OBJ) $(LINK_STAMP)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(OBJ)

$(LIB_SO): $(OBJ) $(LINK_STAMP)
	$(LINK) -shared $(SO_LDFLAGS) -o $@ $(OBJ) $(LDLIBS)

# The commit the program is built from (+dirty with uncommitted changes; empty
# outside a git checkout), for the records `flashqla bench` writes.
BUILD_COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null)$(shell git rev-parse --git-dir >/dev/null 2>&1 && \
                  { git diff --quiet HEAD -- 2>/dev/null || echo +dirty; })

$(CLI): $(wildcard cli/*.c cli/*.h) $(LIB_A) $(C_STAMP) $(LINK_STAMP)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -DFQLA_BUILD_COMMIT='"$(BUILD_COMMIT)"' $(wildcard cli/*.c) $(LIB_A) -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(wildcard tests/common/*.h src/cuda/*.h) $(LIB_A) $(C_STAMP) $(LINK_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests $< $(TEST_COMMON) $(LIB_A) -o $@ $(LDLIBS)

# --- sanitizer build of the library (C sources, CUDA stubbed) and the tests ---
ASAN_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_CFLAGS = -std=c99 -Wall -Wextra -pedantic -Iinclude -Isrc -Itests -pthread -D_POSIX_C_SOURCE=200809L $(VERSION_DEFS) \
              -DFQLA_TEST_NO_CUDA_REASON='"the sanitizer build stubs CUDA"'
ASAN_OBJ = $(PROD_C_SRC:%.c=$(BUILD)/asan/obj/%.o)
ASAN_TESTS = $(TEST_SRC:tests/%.c=$(BUILD)/asan/tests/%)
$(ASAN_TESTS): $(ASAN_OBJ)

$(BUILD)/asan/obj/%.o: %.c $(wildcard include/*.h src/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(BUILD)/asan/tests/%: tests/%.c $(TEST_COMMON) $(ASAN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(ASAN_FLAGS) $< $(TEST_COMMON) $(ASAN_OBJ) -o $@ -lm

# --- libFuzzer over the argument validation (clang only) ---
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 90
FUZZ_OBJ = $(PROD_C_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
$(BUILD)/fuzz/obj/%.o: %.c $(wildcard include/*.h src/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(ASAN_CFLAGS) -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -c $< -o $@
$(BUILD)/fuzz/fuzz_validate: fuzz/fuzz_validate.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(ASAN_CFLAGS) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $^ -o $@ -lm

test-fast: $(TESTS) $(CU_TESTS)
	tests/run_tests.sh $(BUILD)/tests

test-asan: $(ASAN_TESTS)
	FQLA_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 tests/run_tests.sh $(BUILD)/asan/tests

# The CPU library and its tests cross-built for aarch64 (NEON bodies) into
# build-aarch64/ and run under qemu-user; skipped, saying why, without the
# cross gcc or qemu (tests/run_aarch64.sh). Also a section of `make test`.
test-aarch64:
	tests/run_aarch64.sh build-aarch64

fuzz: $(BUILD)/fuzz/fuzz_validate
	@mkdir -p $(BUILD)/fuzz/corpus
	$(BUILD)/fuzz/fuzz_validate -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/fuzz/corpus

test: all $(TESTS) $(CU_TESTS) $(ASAN_TESTS) $(BUILD)/fuzz/fuzz_validate
	FQLA_DEV_BUILD=$(DEV) tests/run_all.sh $(BUILD) $(FUZZ_SECONDS)

run: all
	$(CLI) run

clean:
	rm -rf $(BUILD)

# --- install: the header (its version defaults written from VERSION), both
# libraries and a pkg-config file (a CUDA build's static library needs the CUDA
# runtime libraries: Libs.private) ---
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PC_LIBS_PRIVATE = -lm -pthread$(if $(strip $(NVCC)), $(CUDA_LIBS))
install: $(LIB_A) $(LIB_SO)
	@mkdir -p $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	sed -e 's/^#define FQLA_VERSION_MAJOR .*/#define FQLA_VERSION_MAJOR $(word 1,$(VERSION_PARTS))/' \
	    -e 's/^#define FQLA_VERSION_MINOR .*/#define FQLA_VERSION_MINOR $(word 2,$(VERSION_PARTS))/' \
	    -e 's/^#define FQLA_VERSION_PATCH .*/#define FQLA_VERSION_PATCH $(word 3,$(VERSION_PARTS))/' \
	    include/flashqla.h > $(DESTDIR)$(INCLUDEDIR)/flashqla.h
	cp $(LIB_A) $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: flashqla' 'Description: Gated DeltaNet linear-attention kernels (CPU, CUDA sm_90a)' \
	  'Version: $(VERSION_STRING)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lflashqla' \
	  'Libs.private: $(PC_LIBS_PRIVATE)' > $(DESTDIR)$(LIBDIR)/pkgconfig/flashqla.pc

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/flashqla.h $(DESTDIR)$(LIBDIR)/libflashqla.a \
	      $(DESTDIR)$(LIBDIR)/libflashqla.so $(DESTDIR)$(LIBDIR)/pkgconfig/flashqla.pc
