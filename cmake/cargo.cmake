# Rust crates built by cargo into static libraries (tools/chat-template, plugins/llguidance): the
# cargo found once for the whole build, and one function that adds a crate.
#
# cargo runs the rustc beside it (rustup's proxy, or Debian's /usr/bin/rustc), so that
# -DCARGO=/usr/bin/cargo builds with Debian's Rust even where rustup's comes first in PATH. Without
# -DCARGO, the cargo whose rustc is newest of the one on PATH and rustup's (~/.cargo/bin): each
# crate needs at least its rust-version.
function(specinfer_rust_versions cargo out_cargo out_rustc out_host out_rustc_path)
  set(cargo_version "")
  set(rustc_version "")
  set(host "")
  get_filename_component(cargo_dir ${cargo} DIRECTORY)
  find_program(rustc_path rustc HINTS ${cargo_dir} NO_DEFAULT_PATH NO_CACHE)
  if(NOT rustc_path)
    find_program(rustc_path rustc NO_CACHE)
  endif()
  execute_process(COMMAND ${cargo} --version OUTPUT_VARIABLE cargo_out ERROR_QUIET)
  string(REGEX MATCH "^cargo [0-9]+\\.[0-9]+(\\.[0-9]+)?" cargo_version "${cargo_out}")
  string(REPLACE "cargo " "" cargo_version "${cargo_version}")
  if(rustc_path)
    execute_process(COMMAND ${rustc_path} -vV OUTPUT_VARIABLE rustc_info ERROR_QUIET)
    string(REGEX MATCH "release: [0-9]+\\.[0-9]+(\\.[0-9]+)?" rustc_version "${rustc_info}")
    string(REPLACE "release: " "" rustc_version "${rustc_version}")
    string(REGEX MATCH "host: [^\n]+" host "${rustc_info}")
    string(REPLACE "host: " "" host "${host}")
  endif()
  set(${out_cargo} "${cargo_version}" PARENT_SCOPE)
  set(${out_rustc} "${rustc_version}" PARENT_SCOPE)
  set(${out_host} "${host}" PARENT_SCOPE)
  set(${out_rustc_path} "${rustc_path}" PARENT_SCOPE)
endfunction()

if(NOT CARGO)
  find_program(path_cargo cargo NO_CACHE)
  set(best "")
  set(best_rustc "")
  foreach(candidate ${path_cargo} $ENV{CARGO_HOME}/bin/cargo $ENV{HOME}/.cargo/bin/cargo)
    if(EXISTS ${candidate})
      specinfer_rust_versions(${candidate} c r h p)
      if(r AND (NOT best_rustc OR r VERSION_GREATER best_rustc))
        set(best ${candidate})
        set(best_rustc ${r})
      endif()
    endif()
  endforeach()
  if(best)
    set(CARGO ${best} CACHE FILEPATH "cargo for the Rust crates (tools/chat-template, plugins/llguidance)")
  endif()
endif()
set(SPECINFER_CARGO_VERSION "")
set(SPECINFER_RUSTC_VERSION "")
set(SPECINFER_RUST_HOST "")
set(SPECINFER_RUSTC "")
if(CARGO)
  specinfer_rust_versions(${CARGO} SPECINFER_CARGO_VERSION SPECINFER_RUSTC_VERSION
                          SPECINFER_RUST_HOST SPECINFER_RUSTC)
endif()

# Cargo's target directory: the build's own (one per crate) unless SPECINFER_CARGO_TARGET_DIR
# names one that several builds share (scripts/test: the release and sanitizer builds compile the
# crates once; they are Rust, which the sanitizer flags do not reach).
set(SPECINFER_CARGO_TARGET_DIR "" CACHE PATH "cargo's target directory for the Rust crates")

# specinfer_cargo_staticlib(<prefix> <crate dir> <library name>): when the rustc found is at least
# the crate's rust-version, adds the custom target <prefix>_build, which runs
# `cargo build --release --locked` on the crate's Cargo.toml, Cargo.lock and src/*.rs, and sets in
# the caller's scope <prefix>_FOUND (TRUE / FALSE), <prefix>_LIB (the lib<library name>.a it
# builds), <prefix>_CARGO (the cargo command line with its environment, for tests) and
# <prefix>_RUST_MIN (the crate's rust-version).
function(specinfer_cargo_staticlib prefix dir lib)
  file(STRINGS ${dir}/Cargo.toml rust_min REGEX "^rust-version")
  string(REGEX REPLACE ".*\"([0-9.]+)\".*" "\\1" rust_min "${rust_min}")
  set(${prefix}_RUST_MIN ${rust_min} PARENT_SCOPE)
  if(NOT (SPECINFER_CARGO_VERSION AND SPECINFER_RUSTC_VERSION AND
          SPECINFER_RUSTC_VERSION VERSION_GREATER_EQUAL rust_min))
    set(${prefix}_FOUND FALSE PARENT_SCOPE)
    return()
  endif()
  if(SPECINFER_CARGO_TARGET_DIR)
    set(target_dir ${SPECINFER_CARGO_TARGET_DIR})
  else()
    get_filename_component(crate ${dir} NAME)
    set(target_dir ${CMAKE_BINARY_DIR}/cargo-${crate})
  endif()
  # Cargo before 1.68 (Debian 12's is 1.65) reads crates.io's index by cloning its git
  # repository; the HTTP index that later ones use is there an unstable flag, which
  # RUSTC_BOOTSTRAP=1 lets a stable cargo take.
  set(cargo ${CMAKE_COMMAND} -E env CARGO_TARGET_DIR=${target_dir} RUSTC=${SPECINFER_RUSTC})
  if(SPECINFER_CARGO_VERSION VERSION_LESS 1.68)
    list(APPEND cargo RUSTC_BOOTSTRAP=1 ${CARGO} -Z sparse-registry)
  else()
    list(APPEND cargo ${CARGO})
  endif()
  set(out ${target_dir}/release/lib${lib}.a)
  file(GLOB rust_sources CONFIGURE_DEPENDS ${dir}/src/*.rs)
  add_custom_command(OUTPUT ${out}
    COMMAND ${cargo} build --release --locked --quiet --manifest-path ${dir}/Cargo.toml
    DEPENDS ${dir}/Cargo.toml ${dir}/Cargo.lock ${rust_sources}
    COMMENT "cargo: ${lib}"
    USES_TERMINAL)
  add_custom_target(${prefix}_build DEPENDS ${out})
  set(${prefix}_FOUND TRUE PARENT_SCOPE)
  set(${prefix}_LIB ${out} PARENT_SCOPE)
  set(${prefix}_CARGO ${cargo} PARENT_SCOPE)
endfunction()
