#!/usr/bin/env bash
# make install-test: installs into temporary prefixes and uses the result as
# a user or a distribution would. Run from the repository root by the
# Makefile, which passes MAKE, TEST_CC, CWARN, RELEASE, LIB_REAL, LIB_SONAME
# and MAN_PAGES. Prints one line per check and "install-test: N passed, M
# failed". The C compiler comes as TEST_CC, not CC: a CC in the environment
# of the make install below would make cargo rebuild zstd-sys (its build
# script reruns when CC changes), hence relink liballoctrace.so, and the
# next `make test` would relink every C test.
set -u
pass=0; fail=0
ok()   { echo "ok   install: $*"; pass=$((pass+1)); }
bad()  { echo "FAIL install: $*"; fail=$((fail+1)); }
skip() { echo "skip install: skipped: $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prefix=$dir/usr
root=$PWD
awk '/<!-- readme-example/{f=1;next} f&&/^```c/{p=1;next} p&&/^```/{exit} p' README.md > "$dir/example.c"

# make and make install never regenerate the committed header.
if $MAKE -n install PREFIX="$prefix" | grep -q 'header-gen'; then
  bad "make install would run the header generator"
else ok "make install does not regenerate include/alloctrace.h"; fi

if ! $MAKE install PREFIX="$prefix" >"$dir/install.log" 2>&1; then
  cat "$dir/install.log"; bad "make install PREFIX=$prefix failed"
  echo "install-test: $pass passed, $fail failed"; exit 1
fi
manifest=$($MAKE -s install-manifest PREFIX="$prefix")
missing=0
for f in $manifest; do [ -e "$f" ] || { echo "  missing: $f"; missing=1; }; done
check "every file of the manifest installed ($(echo "$manifest" | wc -l) files)" [ $missing -eq 0 ]
extra=$(cd "$dir" && find usr \( -type f -o -type l \) | sed "s|^|$dir/|" | sort | comm -23 - <(echo "$manifest" | sort))
check "nothing installed outside the manifest${extra:+: $extra}" [ -z "$extra" ]

# Stripped: each installed object is smaller than the build tree's.
for pair in "bin/alloctrace:$RELEASE/alloctrace" "lib/$LIB_REAL:$RELEASE/liballoctrace.so" \
            "lib/liballoctrace.a:$RELEASE/liballoctrace.a" "lib/liballoctrace_preload.so:$RELEASE/liballoctrace_preload.so"; do
  inst=$prefix/${pair%%:*}; built=${pair#*:}
  si=$(stat -c %s "$inst" 2>/dev/null || echo 0); sb=$(stat -c %s "$built")
  check "${pair%%:*} stripped: $sb -> $si bytes" [ "$si" -gt 0 -a "$si" -lt "$sb" ]
done
check "bin/alloctrace and $LIB_REAL have no .debug_info" \
  sh -c "! readelf -S '$prefix/bin/alloctrace' '$prefix/lib/$LIB_REAL' | grep -q debug_info"

# SONAME and the versioned names.
soname=$(readelf -d "$prefix/lib/$LIB_REAL" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check "SONAME of lib/$LIB_REAL is $LIB_SONAME (readelf -d: '$soname')" [ "$soname" = "$LIB_SONAME" ]
check "lib/liballoctrace.so -> $LIB_SONAME -> $LIB_REAL" \
  [ "$(readlink "$prefix/lib/liballoctrace.so")" = "$LIB_SONAME" -a "$(readlink "$prefix/lib/$LIB_SONAME")" = "$LIB_REAL" ]

# The README example, with pkg-config: shared (needs the SONAME), then
# statically against liballoctrace.a with `pkg-config --static`.
if command -v pkg-config >/dev/null; then
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  if (cd "$dir" && $TEST_CC $CWARN example.c $(pkg-config --cflags --libs alloctrace) -Wl,-rpath,"$prefix/lib" -o example &&
      readelf -d example | grep -q "NEEDED.*\[$LIB_SONAME\]" && ./example && "$prefix/bin/alloctrace" check example.trace >/dev/null); then
    ok "README example built with pkg-config --cflags --libs alloctrace, needs $LIB_SONAME, its trace checks ok"
  else bad "README example with pkg-config"; fi
  libs=$(pkg-config --static --libs alloctrace | sed 's/-lalloctrace\b/-l:liballoctrace.a/')
  if (cd "$dir" && rm -f example.trace && $TEST_CC $CWARN example.c $(pkg-config --cflags alloctrace) $libs -o example_static &&
      ! readelf -d example_static | grep -q liballoctrace && ./example_static && "$prefix/bin/alloctrace" check example.trace >/dev/null); then
    ok "README example linked statically with pkg-config --static --libs ($libs), its trace checks ok"
  else bad "README example with pkg-config --static ($libs)"; fi
  unset PKG_CONFIG_PATH
else skip "pkg-config not installed"; fi

# The README example with CMake: find_package(alloctrace) and alloctrace::alloctrace.
if command -v cmake >/dev/null; then
  mkdir -p "$dir/cmake" && cp cmake/consumer/CMakeLists.txt "$dir/example.c" "$dir/cmake/"
  if (cd "$dir/cmake" && cmake -S . -B build -DCMAKE_PREFIX_PATH="$prefix" >cmake.log 2>&1 &&
      cmake --build build >>cmake.log 2>&1 && readelf -d build/example | grep -q "NEEDED.*\[$LIB_SONAME\]" &&
      ./build/example && "$prefix/bin/alloctrace" check example.trace >/dev/null); then
    ok "README example built with CMake find_package(alloctrace) and alloctrace::alloctrace"
  else cat "$dir/cmake/cmake.log"; bad "README example with CMake"; fi
  if (cd "$dir/cmake" && ! readelf -d build/example_static | grep -q liballoctrace && rm -f example.trace &&
      ./build/example_static && "$prefix/bin/alloctrace" check example.trace >/dev/null); then
    ok "README example built with CMake and alloctrace::alloctrace_static, linked statically"
  else bad "README example with CMake and alloctrace::alloctrace_static"; fi
else skip "cmake not installed: the CMake consumer was not built"; fi

# Man pages and completions, generated from the CLI's clap definition.
gen=$(cd build/gen/man1 && ls | sort | tr '\n' ' ')
want=$(printf '%s\n' $MAN_PAGES | sort | tr '\n' ' ')
check "the generator writes exactly the man pages the Makefile installs ($want)" [ "$gen" = "$want" ]
check "man pages are roff with a NAME and every subcommand's page names its options" \
  sh -c "grep -q '^.TH alloctrace 1' '$prefix/share/man/man1/alloctrace.1' && grep -q 'compression' '$prefix/share/man/man1/alloctrace-record.1'"
if command -v man >/dev/null && man -l "$prefix/share/man/man1/alloctrace-stats.1" 2>/dev/null | grep -q json; then
  ok "man -l renders alloctrace-stats.1"
fi
check "bash completion parses and completes the subcommands" bash -c \
  "source '$prefix/share/bash-completion/completions/alloctrace' && COMP_WORDS=(alloctrace pa) COMP_CWORD=1 && _alloctrace alloctrace pa alloctrace && [[ \" \${COMPREPLY[*]} \" == *' pages '* ]]"
check "zsh and fish completions name every subcommand" sh -c \
  "for c in dump stats pages check record; do grep -q \"\$c\" '$prefix/share/zsh/site-functions/_alloctrace' && grep -q \"\$c\" '$prefix/share/fish/vendor_completions.d/alloctrace.fish' || exit 1; done"
check "licenses installed" cmp -s LICENSE-MIT "$prefix/share/doc/alloctrace/LICENSE-MIT"

# The installed command finds the installed shim.
if (cd "$dir" && env -u ALLOCTRACE_PRELOAD "$prefix/bin/alloctrace" record -o rec.trace -- true 2>rec.err &&
    "$prefix/bin/alloctrace" check rec.trace >/dev/null && grep -q 'rec.trace (pid' rec.err); then
  ok "installed alloctrace record finds the shim in ../lib"
else bad "alloctrace record from the prefix: $(cat "$dir/rec.err")"; fi

# uninstall removes everything install put.
$MAKE uninstall PREFIX="$prefix" >"$dir/uninstall.log" 2>&1 || { cat "$dir/uninstall.log"; bad "make uninstall failed"; }
left=$(find "$prefix" \( -type f -o -type l \) | tr '\n' ' ')
check "make uninstall leaves no file or link behind${left:+: $left}" [ -z "$left" ]

# DESTDIR: staged under DESTDIR; the pkg-config file and the CMake package
# name no installed path (they find the prefix from their own place), so
# the staged tree, moved elsewhere, is used where it is: the README example
# built against it with pkg-config and with CMake, and run.
stage=$dir/stage
if $MAKE install DESTDIR="$stage" PREFIX=/opt/at >"$dir/install2.log" 2>&1 &&
   [ -x "$stage/opt/at/bin/alloctrace" ] && [ -z "$(find "$stage" -path "$stage/opt" -prune -o -type f -print)" ]; then
  ok "make install DESTDIR=... PREFIX=/opt/at stages under DESTDIR"
else cat "$dir/install2.log"; bad "make install with DESTDIR"; fi
pc=lib/pkgconfig/alloctrace.pc; config=lib/cmake/alloctrace/alloctraceConfig.cmake
check "$pc and $config name no installed path (no /opt/at, no $dir)" \
  sh -c "! grep -n -e /opt/at -e '$dir' '$stage/opt/at/$pc' '$stage/opt/at/$config'"
moved=$dir/moved/opt
mkdir -p "$moved" && mv "$stage/opt/at" "$moved/at"
moved=$moved/at
mkdir -p "$dir/relocated"
if command -v pkg-config >/dev/null; then
  if (cd "$dir/relocated" && export PKG_CONFIG_PATH="$moved/lib/pkgconfig" &&
      $TEST_CC $CWARN ../example.c $(pkg-config --cflags --libs alloctrace) \
        -Wl,-rpath,"$(pkg-config --variable=libdir alloctrace)" -o example_pc &&
      ./example_pc && "$moved/bin/alloctrace" check example.trace >/dev/null); then
    ok "the staged tree moved to another directory: README example built with pkg-config from there (\${pcfiledir}), runs"
  else bad "pkg-config on a moved tree: $(PKG_CONFIG_PATH="$moved/lib/pkgconfig" pkg-config --cflags --libs alloctrace)"; fi
else skip "pkg-config not installed: the moved tree was not built against with it"; fi
if command -v cmake >/dev/null; then
  mkdir -p "$dir/relocated/cmake" && cp cmake/consumer/CMakeLists.txt "$dir/example.c" "$dir/relocated/cmake/"
  if (cd "$dir/relocated/cmake" && cmake -S . -B build -DCMAKE_PREFIX_PATH="$moved" >cmake.log 2>&1 &&
      cmake --build build >>cmake.log 2>&1 && ./build/example && "$moved/bin/alloctrace" check example.trace >/dev/null &&
      rm example.trace && ./build/example_static && "$moved/bin/alloctrace" check example.trace >/dev/null); then
    ok "the staged tree moved to another directory: README example built with CMake from there (PACKAGE_PREFIX_DIR), shared and static, runs"
  else cat "$dir/relocated/cmake/cmake.log"; bad "CMake on a moved tree"; fi
else skip "cmake not installed: the moved tree was not built against with it"; fi
$MAKE uninstall DESTDIR="$dir/moved" PREFIX=/opt/at >/dev/null 2>&1
left=$(find "$dir/moved" "$stage" \( -type f -o -type l \) | tr '\n' ' ')
check "make uninstall DESTDIR=... leaves nothing${left:+: $left}" [ -z "$left" ]

echo "install-test: $pass passed, $fail failed"
[ $fail -eq 0 ]
