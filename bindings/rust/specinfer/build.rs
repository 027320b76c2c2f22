// Lets the tests and examples find libspecinfer at run time without LD_LIBRARY_PATH: the
// specinfer-sys build script publishes the library directory it found with pkg-config.
fn main() {
    if let Ok(dir) = std::env::var("DEP_SPECINFER_LIBDIR") {
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{dir}");
    }
}
