//! The two functions of the C maths library that code linked into the
//! binary calls: `pow` (tokio's scheduler statistics) and `log` (SQLite's
//! full-text ranking, which leaderd never runs). Defined here, from the
//! pure-Rust `libm` crate, so that the binary does not load glibc's
//! `libm.so.6` at all: a daemon leading one election was resident by
//! 0.9 MiB more with it, 596 KiB of them the library's own pages, mapped
//! at the start and never used again (BENCHMARKS.md, "Memory per
//! election"). Should another one be called, the library comes back: the
//! container test fails on it. `build.rs` keeps both to the binary.

/// `x` to the power `y`, as C's `pow`.
// `no_mangle`: the linker must find it by C's name.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

/// The natural logarithm of `x`, as C's `log`.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn log(x: f64) -> f64 {
    libm::log(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn they_answer_as_c_does() {
        assert_eq!(pow(2.0, 10.0), 1024.0);
        assert_eq!(pow(0.5, -2.0), 4.0);
        assert!(pow(-1.0, 0.5).is_nan());
        // tokio's use: a decay factor between 0 and 1.
        assert!((pow(0.1, 0.25) - 0.562_341_325_190_349).abs() < 1e-15);
        assert_eq!(log(1.0), 0.0);
        assert!((log(std::f64::consts::E) - 1.0).abs() < 1e-15);
        assert_eq!(log(0.0), f64::NEG_INFINITY);
    }
}
