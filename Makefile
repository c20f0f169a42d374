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
INLINE_HEADER := include/alloctrace_inline.h
VERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# The library's ABI version, its SONAME's number (build.rs, docs/ABI.md).
SOVERSION := $(shell sed -n 's/^const SOVERSION: &str = "\(.*\)";/\1/p' build.rs)

CWARN     := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpedantic -Werror
CFLAGS    ?= -O1 -g
ASAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LINK      := -L$(RELEASE) -lalloctrace -Wl,-rpath,$(abspath $(RELEASE)) -lpthread -lm

C_TESTS   := $(sort $(wildcard c_tests/test_*.c))
C_COMMON  := $(wildcard c_tests/common.c)
C_BINS    := $(patsubst c_tests/%.c,$(BUILD)/c_tests/%,$(C_TESTS))
WRITER_BINS := $(patsubst c_tests/%.c,$(BUILD)/c_tests/writer/%,$(C_TESTS))
ASAN_BINS := $(patsubst c_tests/%.c,$(BUILD)/c_tests/asan/%,$(shell grep -L 'alloctrace-test: no-asan' $(C_TESTS) /dev/null 2>/dev/null | grep test_))

.PHONY: all lib cli header check-header lint miri test rust-test c-test c-test-plain c-test-asan readme-example loom demo clean fuzz
.PHONY: preload preload-test preload-panic install install-test python-test

# `make` builds; it never regenerates the committed header (`make header`
# does, `make test` checks it).
all: lib cli preload

# The library, and target/release/liballoctrace.so.0 (its SONAME, which
# programs linked in the build tree load) pointing to it. Programs depend
# on the file, not on the phony `lib`, so they are relinked only when
# cargo rebuilt the library; FORCE lets cargo decide that on every run.
lib: $(LIB_SO)

.PHONY: FORCE
$(LIB_SO): FORCE
	$(CARGO) build --release -p alloctrace
	@ln -sf liballoctrace.so $(RELEASE)/liballoctrace.so.$(SOVERSION)

cli:
	$(CARGO) build --release -p alloctrace-cli

# The LD_PRELOAD shim (crates/preload): target/release/liballoctrace_preload.so.
preload:
	$(CARGO) build --release -p alloctrace-preload

# The headers are generated and committed: alloctrace.h from src/capi.rs
# (cbindgen), alloctrace_format.h from the format crate, and the per-kind
# wrappers of the otherwise hand-written alloctrace_inline.h from the format
# crate's event spec.
header:
	$(CARGO) run --quiet --release -p alloctrace-header-gen -- $(HEADER) $(FORMAT_HEADER) $(INLINE_HEADER)

check-header:
	@mkdir -p $(BUILD)
	$(CARGO) run --quiet --release -p alloctrace-header-gen -- $(BUILD)/alloctrace.h $(BUILD)/alloctrace_format.h $(BUILD)/alloctrace_inline.h
	@for h in $(HEADER) $(FORMAT_HEADER) $(INLINE_HEADER); do \
	  if ! diff -u $$h $(BUILD)/$$(basename $$h); then \
	    echo "error: $$h is stale: run 'make header' and commit it"; exit 1; fi; done
	@echo "header: $(HEADER), $(FORMAT_HEADER) and $(INLINE_HEADER) are up to date"

test: check-header lint lib cli rust-test loom miri c-test readme-example preload-test install-test bench-test python-test

# The code gates: rustfmt's layout and clippy with warnings as errors
# (the workspace's [lints] turn on clippy::undocumented_unsafe_blocks and
# check std APIs against rust-version). --all-targets leaves out the
# shim's tests, which only `make preload-test` runs (test = false).
# rustdoc with warnings as errors keeps the API docs' links resolving.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p alloctrace-preload --test shim -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet

# The call-stack tests (crates/cli/tests/stacks.rs) run programs under the
# shim and against liballoctrace.so: build both first (cargo test builds a
# cdylib's test harness, not the library file).
rust-test: lib preload
	$(CARGO) test --workspace --release

# Model-check the generation-advance handshake (crates/writer/tests/loom_handshake.rs).
loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test --release -p alloctrace-writer --test loom_handshake

# Miri (a nightly toolchain's interpreter that reports undefined behaviour)
# runs what it can: the format's encoders and decoders, the compression
# model, the reader's decoders, and the writer's buffers and its type,
# frame and call-stack tables (their unsafe code; raw syscalls become libc's mmap under cfg(miri)).
# Rounds are scaled down under Miri; zstd and the event path's syscalls
# are C or kernel work it cannot run. Skipped, saying so, without Miri.
MIRI := $(CARGO) +nightly miri
miri:
	@if ! $(MIRI) --version >/dev/null 2>&1; then \
	  echo "miri: skipped: Miri is not installed (rustup toolchain install nightly --component miri,rust-src)"; \
	else set -e; export MIRIFLAGS=-Zmiri-permissive-provenance; \
	  $(MIRI) test -q -p alloctrace-format --lib; \
	  $(MIRI) test -q -p alloctrace-format --test compression_model -- any_batches many_batches size_classes codes_the_model; \
	  $(MIRI) test -q -p alloctrace-reader --lib; \
	  $(MIRI) test -q -p alloctrace-writer --lib -- type_table buffer::tests::a_buffer frame_table \
	    call_stack_table::tests::stacks call_stack_table::tests::a_generation call_stack_table::tests::threads; \
	  echo "miri: format, compression model, reader decoders, writer buffers, type, frame and call-stack tables: no undefined behaviour"; fi

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

$(BUILD)/c_tests/%: c_tests/%.c $(C_COMMON) $(HEADER) $(LIB_SO)
	@mkdir -p $(dir $@)
	$(CC) $(CWARN) $(CFLAGS) -Iinclude -Ic_tests $< $(C_COMMON) $(LINK) -o $@

# The same tests with every event call through the inline trace_writer_*
# path (c_tests/common.h, TEST_WRITER), optimised as a runtime would be.
$(BUILD)/c_tests/writer/%: c_tests/%.c $(C_COMMON) $(HEADER) include/alloctrace_inline.h $(FORMAT_HEADER) $(LIB_SO)
	@mkdir -p $(dir $@)
	$(CC) $(CWARN) -O2 -g -DTEST_WRITER -Iinclude -Ic_tests $< $(C_COMMON) $(LINK) -o $@

$(BUILD)/c_tests/asan/%: c_tests/%.c $(C_COMMON) $(HEADER) $(LIB_SO)
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

# Builds everything the README's next steps use (library, command, shim),
# traces the demo program (the C API) and prints its stats, records the
# leaky example under the shim and prints who leaked and who held the
# peak, writes its HTML report, then commands to try next, with paths that
# work from the repository root.
demo: lib cli preload $(BUILD)/demo $(BUILD)/leaky
	@rm -f $(BUILD)/demo.trace
	$(BUILD)/demo $(BUILD)/demo.trace
	$(CLI) stats $(BUILD)/demo.trace
	@echo
	$(CLI) record --overwrite -o $(BUILD)/leaky.trace -- $(BUILD)/leaky
	$(CLI) leaks $(BUILD)/leaky.trace
	$(CLI) top $(BUILD)/leaky.trace --sort peak -n 3
	$(CLI) report $(BUILD)/leaky.trace -o $(BUILD)/leaky.html
	@echo
	@echo "Built: $(CLI) (the command), $(PRELOAD_SO) (the LD_PRELOAD shim),"
	@echo "       $(LIB_SO), $(LIB_A) and $(HEADER) (the C API). Next, from here:"
	@printf '  %-68s # %s\n' \
	  "open $(BUILD)/leaky.html" "the report: heap over time, peak, leaks, ..." \
	  "$(CLI) flamegraph $(BUILD)/leaky.trace --metric peak -o peak.svg" "who held the peak, as a flame graph" \
	  "$(CLI) dump $(BUILD)/demo.trace | head" "the events, one per line" \
	  "$(CLI) record --overwrite -o ls.trace -- ls -l /" "any program, through the shim" \
	  "$(CLI) top ls.trace --by function" "... who allocates in it" \
	  "$(CLI) export ls.trace --format pprof -o ls.pb.gz" "... for go tool pprof (or parquet, chrome)"
	@echo "  The C API (docs/C-API.md): build a program my.c with"
	@echo "  cc -Iinclude my.c -L$(RELEASE) -lalloctrace -lpthread -Wl,-rpath,\$$PWD/$(RELEASE) -o my"

# The reports' example (and test) program: known leaks, temporaries and peak.
$(BUILD)/leaky: c_tests/reports/leaky.c
	@mkdir -p $(BUILD)
	$(CC) $(CWARN) -O2 -g $< -o $@

$(BUILD)/demo: examples/demo.c $(HEADER) $(LIB_SO)
	@mkdir -p $(BUILD)
	$(CC) $(CWARN) -O2 -g -Iinclude $< $(LINK) -o $@

# The README's C example must compile as written and produce a valid trace.
readme-example: lib cli
	@mkdir -p $(BUILD)/readme
	awk '/<!-- readme-example/{f=1;next} f&&/^```c/{p=1;next} p&&/^```/{exit} p' README.md > $(BUILD)/readme/example.c
	$(CC) $(CWARN) -Iinclude $(BUILD)/readme/example.c $(LINK) -o $(BUILD)/readme/example
	cd $(BUILD)/readme && rm -f example.trace && ./example && $(abspath $(CLI)) check example.trace
	@echo "readme-example: 1 passed, 0 failed"

# The shim's tests (crates/preload/tests/shim, one test per case, run in
# parallel): the test programs, the reference counting interposers and
# real programs under the shim, the test programs under the panic-test
# shim (PANIC_SO, below), and `alloctrace record`. They find what this
# target builds through the ALLOCTRACE_TEST_* variables (a plain `cargo
# test` leaves them out).
PRELOAD_SO     := $(RELEASE)/liballoctrace_preload.so
PRELOAD_DIR    := c_tests/preload
PRELOAD_BIN    := $(BUILD)/preload
PRELOAD_CFLAGS := $(CWARN) $(CFLAGS) -fno-builtin -I$(PRELOAD_DIR)
# Allocators prog_allocator is linked against, as name:library (Debian's
# libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0). One that is not
# installed is not built, and its tests skip, saying so.
PRELOAD_ALLOCATORS := jemalloc:libjemalloc.so.2 tcmalloc:libtcmalloc_minimal.so.4 mimalloc:libmimalloc.so.2
preload_alloc_lib = $(patsubst $(1):%,%,$(filter $(1):%,$(PRELOAD_ALLOCATORS)))
PRELOAD_PROGS  := $(patsubst $(PRELOAD_DIR)/%.c,$(PRELOAD_BIN)/%,$(sort $(wildcard $(PRELOAD_DIR)/prog_*.c))) \
                  $(PRELOAD_BIN)/libcounter.so $(PRELOAD_BIN)/libchain.so $(PRELOAD_BIN)/libearly.so $(PRELOAD_BIN)/libsigearly.so \
                  $(foreach a,$(PRELOAD_ALLOCATORS),$(PRELOAD_BIN)/linked_$(firstword $(subst :, ,$(a))))

preload-test: preload preload-panic cli $(PRELOAD_PROGS)
	ALLOCTRACE_TEST_CLI=$(abspath $(CLI)) ALLOCTRACE_TEST_SO=$(abspath $(PRELOAD_SO)) \
	  ALLOCTRACE_TEST_PROGS=$(abspath $(PRELOAD_BIN)) ALLOCTRACE_TEST_PANIC_SO=$(abspath $(PANIC_SO)) \
	  $(CARGO) test --release -p alloctrace-preload --test shim

# A second shim with the test hook that makes one recording panic
# (feature panic-test: crates/preload/src/boundary.rs), for the panic
# boundary's tests. Its own target directory, so the shim above is
# neither replaced nor rebuilt; the release profile, as shipped (a first
# build there takes about as long as the shim's, later ones seconds).
PANIC_TARGET := target/panic-test
PANIC_SO     := $(PANIC_TARGET)/release/liballoctrace_preload.so
preload-panic:
	CARGO_TARGET_DIR=$(PANIC_TARGET) $(CARGO) build --release -p alloctrace-preload --features panic-test

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

# `make install PREFIX=/usr/local`: the command, the library (versioned,
# with its SONAME links), the static library, the shim, the headers, a
# pkg-config file, a CMake package, man pages, shell completions and the
# licenses. Binaries and shared objects are installed with
# `strip --strip-unneeded`, the static library with `--strip-debug`
# (`STRIP=true` keeps everything, for a distribution's -dbg split).
# DESTDIR is honoured for packaging, and the installed tree can be moved
# (the .pc and CMake files find the prefix from their own place, below);
# `make uninstall` (same PREFIX and
# DESTDIR) removes exactly these files. Neither rebuilds the header.
PREFIX     ?= /usr/local
DESTDIR    ?=
STRIP      ?= strip
BINDIR     := $(PREFIX)/bin
LIBDIR     := $(PREFIX)/lib
INCLUDEDIR := $(PREFIX)/include
DATADIR    := $(PREFIX)/share
MANDIR     := $(DATADIR)/man
DOCDIR     := $(DATADIR)/doc/alloctrace
CMAKEDIR   := $(LIBDIR)/cmake/alloctrace
BASHCOMPDIR := $(DATADIR)/bash-completion/completions
ZSHCOMPDIR  := $(DATADIR)/zsh/site-functions
FISHCOMPDIR := $(DATADIR)/fish/vendor_completions.d
# The library's names (docs/ABI.md): SONAME liballoctrace.so.SOVERSION,
# file liballoctrace.so.SOVERSION.MINOR.PATCH (the crate's MINOR.PATCH).
LIB_SONAME := liballoctrace.so.$(SOVERSION)
LIB_REAL   := $(LIB_SONAME).$(shell echo $(VERSION) | cut -d. -f2,3)
# What the static library needs besides libc (`cargo rustc --release -p
# alloctrace --crate-type staticlib -- --print native-static-libs`);
# install-test links a program statically with it.
LIBS_PRIVATE := -lgcc_s -lutil -lrt -lpthread -lm -ldl
# The CLI's subcommands, each with a man page (install-test checks the
# generator writes exactly these).
CLI_COMMANDS := dump stats pages check record top leaks flamegraph diff symbolize export report ps snapshot save
MAN_PAGES  := alloctrace.1 $(patsubst %,alloctrace-%.1,$(CLI_COMMANDS))
GEN        := $(BUILD)/gen

# Every file install puts, relative to DESTDIR (uninstall removes these).
INSTALLED := $(BINDIR)/alloctrace \
  $(LIBDIR)/$(LIB_REAL) $(LIBDIR)/$(LIB_SONAME) $(LIBDIR)/liballoctrace.so \
  $(LIBDIR)/liballoctrace.a $(LIBDIR)/liballoctrace_preload.so \
  $(INCLUDEDIR)/alloctrace.h $(INCLUDEDIR)/alloctrace_inline.h $(INCLUDEDIR)/alloctrace_format.h \
  $(LIBDIR)/pkgconfig/alloctrace.pc \
  $(CMAKEDIR)/alloctraceConfig.cmake $(CMAKEDIR)/alloctraceConfigVersion.cmake \
  $(addprefix $(MANDIR)/man1/,$(MAN_PAGES)) \
  $(BASHCOMPDIR)/alloctrace $(ZSHCOMPDIR)/_alloctrace $(FISHCOMPDIR)/alloctrace.fish \
  $(DOCDIR)/LICENSE-MIT $(DOCDIR)/LICENSE-APACHE

empty :=
space := $(empty) $(empty)
# The CMake package and the pkg-config file name no installed path: they
# find the prefix from their own directory (relocatable: a tree staged with
# DESTDIR or moved after installing still works). The ways from there:
# relpath(TO,FROM), without resolving symbolic links.
relpath = $(shell realpath -m -s --relative-to='$(2)' '$(1)')
SUBST = sed -e 's|@CMAKEDIR_TO_PREFIX@|$(call relpath,$(PREFIX),$(CMAKEDIR))|g' \
  -e 's|@PCDIR_TO_PREFIX@|$(call relpath,$(PREFIX),$(LIBDIR)/pkgconfig)|g' \
  -e 's|@PREFIX_TO_LIBDIR@|$(call relpath,$(LIBDIR),$(PREFIX))|g' \
  -e 's|@PREFIX_TO_INCLUDEDIR@|$(call relpath,$(INCLUDEDIR),$(PREFIX))|g' \
  -e 's|@VERSION@|$(VERSION)|g' -e 's|@SOVERSION@|$(SOVERSION)|g' -e 's|@LIB_REAL@|$(LIB_REAL)|g' \
  -e 's|@LIB_SONAME@|$(LIB_SONAME)|g' -e 's|@LIBS_PRIVATE@|$(LIBS_PRIVATE)|g' \
  -e 's|@LIBS_PRIVATE_CMAKE@|$(subst $(space),;,$(strip $(LIBS_PRIVATE)))|g'

.PHONY: uninstall
install: all
	rm -rf $(GEN)
	$(CLI) __generate $(GEN)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(CMAKEDIR) \
	  $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)$(DOCDIR)
	install -m 755 $(CLI) $(DESTDIR)$(BINDIR)/alloctrace
	$(STRIP) --strip-unneeded $(DESTDIR)$(BINDIR)/alloctrace
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/$(LIB_REAL)
	$(STRIP) --strip-unneeded $(DESTDIR)$(LIBDIR)/$(LIB_REAL)
	ln -sf $(LIB_REAL) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/liballoctrace.so
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/liballoctrace.a
	$(STRIP) --strip-debug $(DESTDIR)$(LIBDIR)/liballoctrace.a
	install -m 755 $(PRELOAD_SO) $(DESTDIR)$(LIBDIR)/liballoctrace_preload.so
	$(STRIP) --strip-unneeded $(DESTDIR)$(LIBDIR)/liballoctrace_preload.so
	install -m 644 $(HEADER) include/alloctrace_inline.h $(FORMAT_HEADER) $(DESTDIR)$(INCLUDEDIR)/
	$(SUBST) packaging/alloctrace.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/alloctrace.pc
	$(SUBST) cmake/alloctraceConfig.cmake.in > $(DESTDIR)$(CMAKEDIR)/alloctraceConfig.cmake
	$(SUBST) cmake/alloctraceConfigVersion.cmake.in > $(DESTDIR)$(CMAKEDIR)/alloctraceConfigVersion.cmake
	install -m 644 $(addprefix $(GEN)/man1/,$(MAN_PAGES)) $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(GEN)/completions/alloctrace.bash $(DESTDIR)$(BASHCOMPDIR)/alloctrace
	install -m 644 $(GEN)/completions/_alloctrace $(DESTDIR)$(ZSHCOMPDIR)/_alloctrace
	install -m 644 $(GEN)/completions/alloctrace.fish $(DESTDIR)$(FISHCOMPDIR)/alloctrace.fish
	install -m 644 LICENSE-MIT LICENSE-APACHE $(DESTDIR)$(DOCDIR)/

# Removes the files above and the two directories that are alloctrace's
# own; shared directories (bin, lib, share/man/man1, ...) stay.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(CMAKEDIR) $(DESTDIR)$(DOCDIR) 2>/dev/null

# The Python package (python/, docs/PYTHON.md): a fresh venv under build/,
# the README's `pip install ./python` into it, and python/tests run by it.
# test_memray.py compares the top sites with memray's, which pip installs
# from PyPI into the same venv (as it does the build's setuptools): without
# PyPI this target fails, saying so.
PYTHON3 ?= python3
PY_VENV := $(BUILD)/pyvenv
python-test: lib cli
	rm -rf $(PY_VENV)
	$(PYTHON3) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet ./python
	ALLOCTRACE_CLI=$(abspath $(CLI)) $(PY_VENV)/bin/python python/tests/test_alloctrace.py
	ALLOCTRACE_CLI=$(abspath $(CLI)) ALLOCTRACE_PYTHON_PROFILE_STACKS=1 $(PY_VENV)/bin/python python/tests/test_alloctrace.py
	@$(PY_VENV)/bin/pip install --quiet memray || { echo "error: python-test: pip could not install memray from PyPI (python/tests/test_memray.py needs it)"; exit 1; }
	ALLOCTRACE_CLI=$(abspath $(CLI)) $(PY_VENV)/bin/python python/tests/test_memray.py

# Installs into a temporary prefix and uses it as a user or a distribution
# would (packaging/install-test.sh): the files, their stripped sizes, the
# SONAME and links, the README example built with pkg-config (shared and
# --static) and with CMake, man pages and completions, `alloctrace record`
# finding the shim, uninstall leaving nothing, and a DESTDIR-staged tree
# moved elsewhere built against from there (pkg-config and CMake).
install-test: all
	@MAKE="$(MAKE) --no-print-directory" TEST_CC="$(CC)" CWARN="$(CWARN)" RELEASE=$(RELEASE) \
	  LIB_REAL=$(LIB_REAL) LIB_SONAME=$(LIB_SONAME) MAN_PAGES="$(MAN_PAGES)" packaging/install-test.sh

# The files `make install` puts (with this PREFIX), one a line.
.PHONY: install-manifest
install-manifest:
	@printf '%s\n' $(INSTALLED)

# Coverage-guided fuzzing of the reader (needs cargo-fuzz; see fuzz/README).
fuzz:
	@mkdir -p fuzz/corpus/reader
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run reader corpus/reader seeds -- -max_total_time=$${FUZZ_SECONDS:-60}

# Benchmarks (issues 5, 12, 13, 19): builds bench/*.c and runs bench/run,
# which prints a table of measured values, ratios and targets and writes
# target/bench/results.json. It reports numbers and never fails on them.
# BENCH_ONLY=callgrind make bench runs only the instruction budgets (I1-I2,
# about 30 s); bench/README.md lists the groups. The memray group (issue
# 23) keeps a venv with memray from PyPI and ./python in build/bench/.
BENCH_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wpedantic -Werror -Iinclude -Ibench \
                $(if $(shell grep -l TRACE_CLOCK_COARSE $(HEADER) 2>/dev/null),-DBENCH_HAVE_CLOCK) \
                $(if $(shell grep -l TRACE_COMPRESSION_ZSTD $(HEADER) 2>/dev/null),-DBENCH_HAVE_COMPRESSION) \
                $(if $(shell grep -l trace_stack_capture $(HEADER) 2>/dev/null),-DBENCH_HAVE_STACK_CAPTURE)
BENCH_BINS   := $(addprefix $(BUILD)/bench/,libbenchnoop.so event_cost advance workload workload_capi \
                libcount.so librdtsc.so librecord.so librecord_coarse.so stack_capture threads_rss live_heap)

.PHONY: bench
bench: all $(BENCH_BINS)
	@if [ -d crates/preload ]; then $(CARGO) build --release -p alloctrace-preload; fi
	python3 bench/run

$(BUILD)/bench/event_cost: bench/event_cost.c bench/bench.h $(HEADER) $(LIB_SO) $(BUILD)/bench/libbenchnoop.so
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -L$(BUILD)/bench -lbenchnoop -Wl,-rpath,$(abspath $(BUILD)/bench) $(LINK) -o $@

$(BUILD)/bench/advance: bench/advance.c bench/bench.h $(HEADER) $(LIB_SO)
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< $(LINK) -o $@

# A disabled call's floor: load and branch behind a call into a shared library.
$(BUILD)/bench/libbenchnoop.so: bench/noop.c
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) -fPIC -shared $< -o $@

# Stack capture alone (issue 12): built with frame pointers; its second chain
# turns them off per function (GCC).
$(BUILD)/bench/stack_capture: bench/stack_capture.c bench/bench.h $(HEADER) $(LIB_SO)
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) -fno-omit-frame-pointer $< $(LINK) -o $@

# The bench driver's own tests (parsing, arithmetic; the capture program's
# traces when it is built).
.PHONY: bench-test
bench-test: $(BUILD)/bench/stack_capture cli
	python3 bench/test_run.py

$(BUILD)/bench/workload: bench/workload.c bench/bench.h
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -lpthread -o $@

# The tracer's memory per live thread (issue 19): threads parked, alive.
$(BUILD)/bench/threads_rss: bench/threads_rss.c bench/bench.h
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -lpthread -o $@

# A program with many live objects, for `alloctrace snapshot` (issue 22).
$(BUILD)/bench/live_heap: bench/live_heap.c
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $< -o $@

# The same workload recording its own calls through the C API.
$(BUILD)/bench/workload_capi: bench/workload.c bench/bench.h $(HEADER) $(LIB_SO)
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
