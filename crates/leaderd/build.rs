//! Keeps the C maths functions the binary defines (see `src/maths.rs`) to
//! the binary itself: without it the linker exports them, and a library
//! loaded later (a name service's module) would bind to them rather than
//! to its own.

fn main() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("maths.map");
    println!("cargo:rerun-if-changed={}", script.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--version-script={}",
            script.display()
        );
    }
}
