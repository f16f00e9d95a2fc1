//! How big each part of the bench runs: fully, or shrunk to seconds
//! under `--smoke` so that the test run exercises it without measuring.

/// How big each part runs.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub smoke: bool,
}

impl Size {
    /// `full` normally, `smoke` under `--smoke`.
    pub fn pick<T>(self, full: T, smoke: T) -> T {
        if self.smoke {
            smoke
        } else {
            full
        }
    }
}
