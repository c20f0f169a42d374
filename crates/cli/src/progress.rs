//! "42% of 812 MiB read" on stderr for big traces, only when stderr is a
//! terminal (never in pipes, logs or tests).

use std::io::{self, IsTerminal, Write};

/// Traces smaller than this are read too fast to need progress.
const MIN_SIZE: u64 = 64 << 20;

pub struct Progress {
    enabled: bool,
    total: u64,
    shown_percent: u64,
}

impl Progress {
    pub fn new(total_bytes: u64) -> Progress {
        Progress {
            enabled: total_bytes >= MIN_SIZE && io::stderr().is_terminal(),
            total: total_bytes,
            shown_percent: 0,
        }
    }

    pub fn update(&mut self, bytes_read: u64) {
        if !self.enabled {
            return;
        }
        let percent = (u128::from(bytes_read) * 100 / u128::from(self.total.max(1))) as u64;
        if percent != self.shown_percent {
            self.shown_percent = percent;
            eprint!("\r{percent}% of {} MiB read", self.total >> 20);
            let _ = io::stderr().flush();
        }
    }

    /// Erases the progress line.
    pub fn finish(&mut self) {
        if self.enabled && self.shown_percent > 0 {
            eprint!("\r\x1b[K");
            let _ = io::stderr().flush();
        }
        self.enabled = false;
    }
}
