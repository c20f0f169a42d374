//! A progress bar on stderr while a big trace is read (indicatif), only
//! when stderr is a terminal: never in pipes, logs or tests.

use std::io::{self, IsTerminal};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Traces smaller than this are read too fast to need progress.
const MIN_SIZE: u64 = 64 << 20;

/// Bytes of a trace read so far, against its size. Cheap to update: the
/// bar redraws at most 10 times a second, whatever the number of calls.
pub struct Progress {
    /// `None`: nothing is shown.
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar for a trace of `total_bytes` (0 when unknown: standard input),
    /// shown when the trace is at least 64 MiB and stderr is a terminal.
    pub fn new(total_bytes: u64) -> Progress {
        if !shown(total_bytes, io::stderr().is_terminal()) {
            return Progress::hidden();
        }
        let style = ProgressStyle::with_template(
            "{wide_bar} {percent:>3}% of {total_bytes} read, {binary_bytes_per_sec}, {eta} left",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::with_draw_target(
            Some(total_bytes),
            ProgressDrawTarget::stderr_with_hz(10),
        )
        .with_style(style);
        // Redraws on its own while a long generation is merged, when
        // `update` is not called for a while.
        bar.enable_steady_tick(Duration::from_millis(500));
        Progress { bar: Some(bar) }
    }

    /// Shows nothing: for output that goes to the terminal itself
    /// (`dump` to a terminal), where a bar would break its lines.
    pub fn hidden() -> Progress {
        Progress { bar: None }
    }

    pub fn update(&mut self, bytes_read: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes_read);
        }
    }

    /// Erases the bar.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// Whether a trace of `total_bytes` gets a bar: a big one, and only on a
/// terminal (a pipe or a log file gets nothing).
fn shown(total_bytes: u64, stderr_is_terminal: bool) -> bool {
    stderr_is_terminal && total_bytes >= MIN_SIZE
}

impl Drop for Progress {
    /// A command that fails half-way leaves no bar behind.
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_only_for_big_traces_on_a_terminal() {
        assert!(shown(64 << 20, true));
        assert!(shown(10 << 30, true));
        assert!(!shown(10 << 30, false), "piped: nothing");
        assert!(!shown((64 << 20) - 1, true), "small: nothing");
        assert!(!shown(0, true), "standard input, size unknown: nothing");
    }

    #[test]
    fn a_hidden_bar_takes_updates() {
        let mut p = Progress::hidden();
        p.update(1 << 20);
        p.finish();
        p.update(2 << 20);
    }
}
