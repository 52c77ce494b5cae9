//! Progress reports for long imports.
//!
//! Callers pass a `&mut dyn FnMut(Progress)`. Counters are cumulative within
//! one step and are reported at most every [`REPORT_EVERY`] entries (plus
//! once at the end of the step), so the callback may do I/O cheaply.

/// One progress report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A new phase started ("extracting", "hashing", "layer 2/5 sha256:...").
    Step(String),
    /// Entries processed so far in the current step.
    Files(u64),
    /// Content bytes processed so far in the current step.
    Bytes(u64),
    /// Something the user should know that is not an error (for example
    /// "skipped 12 device nodes under dev/").
    Note(String),
}

/// Entries between two `Files`/`Bytes` reports.
pub const REPORT_EVERY: u64 = 4096;

/// Throttles the counters of one step.
pub(crate) struct Counter<'a> {
    sink: &'a mut dyn FnMut(Progress),
    files: u64,
    bytes: u64,
    next_report: u64,
}

impl<'a> Counter<'a> {
    pub(crate) fn new(sink: &'a mut dyn FnMut(Progress)) -> Self {
        Counter {
            sink,
            files: 0,
            bytes: 0,
            next_report: REPORT_EVERY,
        }
    }

    pub(crate) fn step(&mut self, what: impl Into<String>) {
        self.files = 0;
        self.bytes = 0;
        self.next_report = REPORT_EVERY;
        (self.sink)(Progress::Step(what.into()));
    }

    pub(crate) fn note(&mut self, what: impl Into<String>) {
        (self.sink)(Progress::Note(what.into()));
    }

    pub(crate) fn entry(&mut self, bytes: u64) {
        self.files += 1;
        self.bytes += bytes;
        if self.files >= self.next_report {
            self.next_report += REPORT_EVERY;
            self.flush();
        }
    }

    /// Reports the current totals.
    pub(crate) fn flush(&mut self) {
        (self.sink)(Progress::Files(self.files));
        (self.sink)(Progress::Bytes(self.bytes));
    }
}
