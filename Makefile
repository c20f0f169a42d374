# alloctrace: `make` builds everything (release), `make test` runs every
# test, `make demo` traces the bundled example. See README.md.

CARGO     ?= cargo
CC        ?= cc
RELEASE   := target/release
BUILD     := build
CLI       := $(RELEASE)/alloctrace
LIB_SO    := $(RELEASE)/liballoctrace.so
LIB_A     := $(RELEASE)/liballoctrace.a
HEADER    := include/alloctrace.h
# The format's numbers for the inline path, generated from crates/format.
FORMAT_HEADER := include/alloctrace_format.h

CWARN     := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpedantic -Werror
CFLAGS    ?= -O1 -g
ASAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LINK      := -L$(RELEASE) -lalloctrace -Wl,-rpath,$(abspath $(RELEASE)) -lpthread

C_TESTS   := $(sort $(wildcard c_tests/test_*.c))
C_COMMON  := $(wildcard c_tests/common.c)
C_BINS    := $(patsubst c_tests/%.c,$(BUILD)/c_tests/%,$(C_TESTS))
WRITER_BINS := $(patsubst c_tests/%.c,$(BUILD)/c_tests/writer/%,$(C_TESTS))
ASAN_BINS := $(patsubst c_tests/%.c,$(BUILD)/c_tests/asan/%,$(shell grep -L 'alloctrace-test: no-asan' $(C_TESTS) /dev/null 2>/dev/null | grep test_))

.PHONY: all lib cli header check-header test rust-test c-test c-test-plain c-test-asan readme-example loom demo clean fuzz
.PHONY: preload preload-test install install-test

all: header lib cli preload

lib:
	$(CARGO) build --release -p alloctrace

cli:
	$(CARGO) build --release -p alloctrace-cli

# The LD_PRELOAD shim (crates/preload): target/release/liballoctrace_preload.so.
preload:
	$(CARGO) build --release -p alloctrace-preload

# The headers are generated and committed: alloctrace.h from src/capi.rs
# (cbindgen), alloctrace_format.h from the format crate.
header:
	$(CARGO) run --quiet --release -p alloctrace-header-gen -- $(HEADER) $(FORMAT_HEADER)

check-header:
	@mkdir -p $(BUILD)
	$(CARGO) run --quiet --release -p alloctrace-header-gen -- $(BUILD)/alloctrace.h $(BUILD)/alloctrace_format.h
	@for h in $(HEADER) $(FORMAT_HEADER); do \
	  if ! diff -u $$h $(BUILD)/$$(basename $$h); then \
	    echo "error: $$h is stale: run 'make header' and commit it"; exit 1; fi; done
	@echo "header: $(HEADER) and $(FORMAT_HEADER) are up to date"

test: check-header lib cli rust-test loom c-test readme-example preload-test install-test

rust-test:
	$(CARGO) test --workspace --release

# Model-check the generation-advance handshake (crates/core/tests/loom_handshake.rs).
loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test --release -p alloctrace-core --test loom_handshake

c-test: header-compat c-test-plain c-test-writer c-test-asan

# The header compiles as C in a -fPIC shared object (where the plain calls
# must not keep a thread-local) and as C++ when g++ is installed.
header-compat: $(HEADER) $(FORMAT_HEADER) include/alloctrace_inline.h
	@mkdir -p $(BUILD)
	$(CC) $(CWARN) -O2 -fPIC -shared -Iinclude c_tests/header_compat.c -o $(BUILD)/libheader_compat.so
	@if nm -D $(BUILD)/libheader_compat.so | grep -q __tls_get_addr; then \
	  echo "error: the header made a -fPIC object use a thread-local"; exit 1; fi
	@if command -v $(CXX) >/dev/null 2>&1; then \
	  $(CXX) -std=c++11 -Wall -Wextra -Wpedantic -Werror -O2 -Iinclude -x c++ -c c_tests/header_compat.c -o $(BUILD)/header_compat_cxx.o && \
	  echo "header-compat: C (-fPIC shared) and C++ ok"; \
	else echo "header-compat: C (-fPIC shared) ok; skipped C++: $(CXX) not installed"; fi

$(BUILD)/c_tests/%: c_tests/%.c $(C_COMMON) $(HEADER) lib
	@mkdir -p $(dir $@)
	$(CC) $(CWARN) $(CFLAGS) -Iinclude -Ic_tests $< $(C_COMMON) $(LINK) -o $@

# The same tests with every event call through the inline trace_writer_*
# path (c_tests/common.h, TEST_WRITER), optimised as a runtime would be.
$(BUILD)/c_tests/writer/%: c_tests/%.c $(C_COMMON) $(HEADER) include/alloctrace_inline.h lib
	@mkdir -p $(dir $@)
	$(CC) $(CWARN) -O2 -g -DTEST_WRITER -Iinclude -Ic_tests $< $(C_COMMON) $(LINK) -o $@

$(BUILD)/c_tests/asan/%: c_tests/%.c $(C_COMMON) $(HEADER) lib
	@mkdir -p $(dir $@)
	$(CC) $(CWARN) $(CFLAGS) $(ASAN) -Iinclude -Ic_tests $< $(C_COMMON) $(LINK) -o $@
	@nm $@ | grep -q __asan_init || { echo "error: $@ is not linked with ASan"; exit 1; }

# Each test runs in a fresh directory; it prints PASS and exits 0.
define run_c_tests
	@pass=0; fail=0; for t in $(1); do \
	  dir=$$(mktemp -d); \
	  if ALLOCTRACE_CLI=$(abspath $(CLI)) TEST_TMPDIR=$$dir $(2) $$t; then pass=$$((pass+1)); \
	  else echo "FAIL $$t"; fail=$$((fail+1)); fi; rm -rf $$dir; \
	done; echo "c-tests-$(3): $$pass passed, $$fail failed"; [ $$fail -eq 0 ]
endef

c-test-plain: cli $(C_BINS)
	$(call run_c_tests,$(C_BINS),,plain)

c-test-writer: cli $(WRITER_BINS)
	$(call run_c_tests,$(WRITER_BINS),,writer)

c-test-asan: cli $(ASAN_BINS)
	$(call run_c_tests,$(ASAN_BINS),TEST_SCALE=10 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1,asan)

demo: lib cli $(BUILD)/demo
	@rm -f $(BUILD)/demo.trace
	$(BUILD)/demo $(BUILD)/demo.trace
	$(CLI) stats $(BUILD)/demo.trace

$(BUILD)/demo: examples/demo.c $(HEADER) lib
	@mkdir -p $(BUILD)
	$(CC) $(CWARN) -O2 -g -Iinclude $< $(LINK) -o $@

# The README's C example must compile as written and produce a valid trace.
readme-example: lib cli
	@mkdir -p $(BUILD)/readme
	awk '/<!-- readme-example/{f=1;next} f&&/^```c/{p=1;next} p&&/^```/{exit} p' README.md > $(BUILD)/readme/example.c
	$(CC) $(CWARN) -Iinclude $(BUILD)/readme/example.c $(LINK) -o $(BUILD)/readme/example
	cd $(BUILD)/readme && rm -f example.trace && ./example && $(abspath $(CLI)) check example.trace
	@echo "readme-example: 1 passed, 0 failed"

# The shim's tests: c_tests/preload/run_tests.sh runs the test programs,
# the reference counting interposer and real programs under the shim.
PRELOAD_SO     := $(RELEASE)/liballoctrace_preload.so
PRELOAD_DIR    := c_tests/preload
PRELOAD_BIN    := $(BUILD)/preload
PRELOAD_CFLAGS := $(CWARN) $(CFLAGS) -fno-builtin -I$(PRELOAD_DIR)
# Allocators prog_allocator is linked against, as name:library (Debian's
# libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0). One that is not
# installed is not built, and run_tests.sh skips its test.
PRELOAD_ALLOCATORS := jemalloc:libjemalloc.so.2 tcmalloc:libtcmalloc_minimal.so.4 mimalloc:libmimalloc.so.2
preload_alloc_lib = $(patsubst $(1):%,%,$(filter $(1):%,$(PRELOAD_ALLOCATORS)))
PRELOAD_PROGS  := $(patsubst $(PRELOAD_DIR)/%.c,$(PRELOAD_BIN)/%,$(sort $(wildcard $(PRELOAD_DIR)/prog_*.c))) \
                  $(PRELOAD_BIN)/libcounter.so $(PRELOAD_BIN)/libearly.so $(PRELOAD_BIN)/libsigearly.so \
                  $(foreach a,$(PRELOAD_ALLOCATORS),$(PRELOAD_BIN)/linked_$(firstword $(subst :, ,$(a))))

preload-test: preload cli $(PRELOAD_PROGS)
	$(PRELOAD_DIR)/run_tests.sh $(abspath $(CLI)) $(abspath $(PRELOAD_SO)) $(abspath $(PRELOAD_BIN))

$(PRELOAD_BIN)/lib%.so: $(PRELOAD_DIR)/lib%.c
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -fPIC -shared $< -o $@

# prog_early links libearly.so, whose constructor allocates before the shim's.
$(PRELOAD_BIN)/prog_early: $(PRELOAD_DIR)/prog_early.c $(PRELOAD_DIR)/common.h $(PRELOAD_BIN)/libearly.so
	$(CC) $(PRELOAD_CFLAGS) $< -L$(PRELOAD_BIN) -learly -Wl,-rpath,$(abspath $(PRELOAD_BIN)) -o $@

# linked_NAME: prog_allocator linked against the allocator NAME.
$(PRELOAD_BIN)/linked_%: $(PRELOAD_DIR)/prog_allocator.c $(PRELOAD_DIR)/common.h
	@mkdir -p $(dir $@)
	@if [ -e "$$($(CC) -print-file-name=$(call preload_alloc_lib,$*))" ]; then \
	  echo "$(CC) $(PRELOAD_CFLAGS) $< -Wl,--no-as-needed -l:$(call preload_alloc_lib,$*) -o $@"; \
	  $(CC) $(PRELOAD_CFLAGS) $< -Wl,--no-as-needed -l:$(call preload_alloc_lib,$*) -o $@; \
	else echo "$(call preload_alloc_lib,$*) is not installed: $@ not built (its test is skipped)"; fi

$(PRELOAD_BIN)/prog_%: $(PRELOAD_DIR)/prog_%.c $(PRELOAD_DIR)/common.h
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) $< -lpthread -lrt -o $@

# `make install PREFIX=/usr/local`: the library, the shim, the header, the
# command and a pkg-config file (DESTDIR is honoured for packaging).
PREFIX  ?= /usr/local
DESTDIR ?=
LIBDIR  := $(PREFIX)/lib
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/alloctrace
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/liballoctrace.so
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/liballoctrace.a
	install -m 755 $(PRELOAD_SO) $(DESTDIR)$(LIBDIR)/liballoctrace_preload.so
	install -m 644 $(HEADER) $(DESTDIR)$(PREFIX)/include/alloctrace.h
	install -m 644 include/alloctrace_inline.h $(DESTDIR)$(PREFIX)/include/alloctrace_inline.h
	install -m 644 $(FORMAT_HEADER) $(DESTDIR)$(PREFIX)/include/alloctrace_format.h
	printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$(LIBDIR)' 'includedir=$${prefix}/include' '' \
	  'Name: alloctrace' 'Description: Memory-allocation tracer with a C ABI' 'Version: $(VERSION)' \
	  'Libs: -L$${libdir} -lalloctrace -lpthread' 'Cflags: -I$${includedir}' > $(DESTDIR)$(LIBDIR)/pkgconfig/alloctrace.pc

# Installs into a temporary prefix and uses it as a user would: the README
# example built with pkg-config, and `alloctrace record` finding the shim.
install-test: all
	@dir=$$(mktemp -d); prefix=$$dir/usr; pass=0; fail=0; \
	$(MAKE) --no-print-directory install PREFIX=$$prefix >$$dir/install.log 2>&1 || { cat $$dir/install.log; fail=$$((fail+1)); }; \
	for f in bin/alloctrace lib/liballoctrace.so lib/liballoctrace.a lib/liballoctrace_preload.so include/alloctrace.h include/alloctrace_inline.h include/alloctrace_format.h lib/pkgconfig/alloctrace.pc; do \
	  if [ -f $$prefix/$$f ]; then pass=$$((pass+1)); else echo "FAIL install: $$f missing"; fail=$$((fail+1)); fi; done; \
	awk '/<!-- readme-example/{f=1;next} f&&/^```c/{p=1;next} p&&/^```/{exit} p' README.md > $$dir/example.c; \
	if command -v pkg-config >/dev/null; then \
	  if (cd $$dir && $(CC) $(CWARN) example.c $$(PKG_CONFIG_PATH=$$prefix/lib/pkgconfig pkg-config --cflags --libs alloctrace) \
	      -Wl,-rpath,$$prefix/lib -o example && ./example && $$prefix/bin/alloctrace check example.trace >/dev/null); then \
	    echo "ok   install: README example built with pkg-config --cflags --libs alloctrace, its trace checks ok"; pass=$$((pass+1)); \
	  else echo "FAIL install: README example with pkg-config"; fail=$$((fail+1)); fi; \
	else echo "skip install: skipped: pkg-config not installed"; fi; \
	if (cd $$dir && env -u ALLOCTRACE_PRELOAD $$prefix/bin/alloctrace record -o rec.trace -- true 2>rec.err && \
	    $$prefix/bin/alloctrace check rec.trace >/dev/null && grep -q 'rec.trace (pid' rec.err); then \
	  echo "ok   install: installed alloctrace record finds the shim in ../lib"; pass=$$((pass+1)); \
	else echo "FAIL install: alloctrace record from the prefix: $$(cat $$dir/rec.err)"; fail=$$((fail+1)); fi; \
	rm -rf $$dir; echo "install-test: $$pass passed, $$fail failed"; [ $$fail -eq 0 ]

# Coverage-guided fuzzing of the reader (needs cargo-fuzz; see fuzz/README).
fuzz:
	@mkdir -p fuzz/corpus/reader
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run reader corpus/reader seeds -- -max_total_time=$${FUZZ_SECONDS:-60}

# Benchmarks (issue 5): builds bench/*.c and runs bench/run, which prints a
# table of measured values, ratios and targets and writes
# target/bench/results.json. It reports numbers and never fails on them.
BENCH_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wpedantic -Werror -Iinclude -Ibench \
                $(if $(shell grep -l TRACE_CLOCK_COARSE $(HEADER) 2>/dev/null),-DBENCH_HAVE_CLOCK) \
                $(if $(shell grep -l TRACE_COMPRESSION_ZSTD $(HEADER) 2>/dev/null),-DBENCH_HAVE_COMPRESSION)
BENCH_BINS   := $(addprefix $(BUILD)/bench/,libbenchnoop.so event_cost advance workload workload_capi \
                libcount.so librdtsc.so librecord.so librecord_coarse.so)

.PHONY: bench
bench: all $(BENCH_BINS)
	@if [ -d crates/preload ]; then $(CARGO) build --release -p alloctrace-preload; fi
	python3 bench/run

$(BUILD)/bench/event_cost: bench/event_cost.c bench/bench.h $(HEADER) lib $(BUILD)/bench/libbenchnoop.so
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -L$(BUILD)/bench -lbenchnoop -Wl,-rpath,$(abspath $(BUILD)/bench) $(LINK) -o $@

$(BUILD)/bench/advance: bench/advance.c bench/bench.h $(HEADER) lib
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< $(LINK) -o $@

# A disabled call's floor: load and branch behind a call into a shared library.
$(BUILD)/bench/libbenchnoop.so: bench/noop.c
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) -fPIC -shared $< -o $@

$(BUILD)/bench/workload: bench/workload.c bench/bench.h
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -lpthread -o $@

# The same workload recording its own calls through the C API.
$(BUILD)/bench/workload_capi: bench/workload.c bench/bench.h $(HEADER) lib
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) -DWITH_CAPI $< $(LINK) -o $@

# Baseline interposers: counting only, counting plus one rdtsc per call, and
# rdtsc (or a shared clock) plus the event's record per call.
INTERPOSE_FLAGS_libcount.so         :=
INTERPOSE_FLAGS_librdtsc.so         := -DWITH_RDTSC
INTERPOSE_FLAGS_librecord.so        := -DWITH_RECORD
INTERPOSE_FLAGS_librecord_coarse.so := -DWITH_RECORD -DRECORD_COARSE
$(BUILD)/bench/libcount.so $(BUILD)/bench/librdtsc.so $(BUILD)/bench/librecord.so \
$(BUILD)/bench/librecord_coarse.so: bench/interpose.c
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $(INTERPOSE_FLAGS_$(notdir $@)) -fPIC -shared -fvisibility=hidden $< -o $@

clean:
	$(CARGO) clean
	rm -rf $(BUILD)
