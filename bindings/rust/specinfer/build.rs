// Lets the tests and examples find libspecinfer at run time without LD_LIBRARY_PATH, and the
// tests its headers: the specinfer-sys build script publishes the directories it found with
// pkg-config.
fn main() {
    // The tests compile a C plugin against the installed headers.
    if let Ok(dir) = std::env::var("DEP_SPECINFER_INCLUDE") {
        println!("cargo:rustc-env=SPECINFER_INCLUDE_DIR={dir}");
    }
    if let Ok(dir) = std::env::var("DEP_SPECINFER_LIBDIR") {
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{dir}");
    }
}
