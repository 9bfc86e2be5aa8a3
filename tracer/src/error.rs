//! A refusal: bad input or an unusable system, reported as one line and exit
//! code 2, before anything is attached.

use std::fmt;

#[derive(Debug)]
pub struct Refusal(pub String);

impl Refusal {
    pub fn new(msg: impl Into<String>) -> Refusal {
        Refusal(msg.into())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// Exit code of a refusal (usage errors from clap use 2 as well).
pub const EXIT_REFUSED: i32 = 2;
