//! Finds the installed specinfer library with pkg-config and tells dependents where it is
//! (DEP_SPECINFER_INCLUDE, DEP_SPECINFER_LIBDIR).

fn main() {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let lib = match pkg_config::Config::new().atleast_version("0.1.0").probe("specinfer") {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!(
                "\nspecinfer-sys: the specinfer C library was not found by pkg-config.\n\
                 Build and install it, then point pkg-config at it:\n\
                 \n    cmake -S <specinfer source> -B build -G Ninja -DCMAKE_INSTALL_PREFIX=$HOME/.local\n\
                 \x20   ninja -C build && cmake --install build\n\
                 \x20   export PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig:$PKG_CONFIG_PATH\n\
                 \x20   export LD_LIBRARY_PATH=$HOME/.local/lib:$LD_LIBRARY_PATH\n\
                 \npkg-config said: {e}\n"
            );
            panic!("specinfer not found by pkg-config (see the message above)");
        }
    };
    // pkg-config drops system include directories from --cflags; ask for the variable then.
    let include = match lib.include_paths.first() {
        Some(p) => p.display().to_string(),
        None => pkg_config::get_variable("specinfer", "includedir").unwrap_or_else(|_| "/usr/include".into()),
    };
    println!("cargo:include={include}");
    println!("cargo:rustc-env=SPECINFER_INCLUDE_DIR={include}");
    if let Some(dir) = lib.link_paths.first() {
        println!("cargo:libdir={}", dir.display());
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", dir.display());
    }
}
