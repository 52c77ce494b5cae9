//! What the QEMU guest fixture's serial log says: a `forkd-guest boot secret=S` line at
//! each boot, then `forkd-guest counter=N secret=S` lines. Shared by the benches
//! (`benches/common`) and `tests/guest.rs`, and free of either's helpers.

/// A serial log's boots and counter lines (complete lines only).
#[derive(Debug, Default)]
pub struct GuestSerial {
    /// How many times the guest booted.
    pub boots: usize,
    /// Each counter line as (N, S), in order.
    pub counters: Vec<(u64, String)>,
}

impl GuestSerial {
    pub fn parse(text: &str) -> GuestSerial {
        let mut s = GuestSerial::default();
        // A line still being written has no newline yet: leave it out.
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        for line in complete.lines() {
            let Some(i) = line.find("forkd-guest ") else {
                continue;
            };
            let rest = line[i + "forkd-guest ".len()..].trim_end_matches('\r');
            if rest.starts_with("boot secret=") {
                s.boots += 1;
            } else if let Some(rest) = rest.strip_prefix("counter=") {
                let mut it = rest.split(' ');
                let n = it.next().and_then(|n| n.parse().ok());
                let secret = it.next().and_then(|x| x.strip_prefix("secret="));
                if let (Some(n), Some(secret)) = (n, secret) {
                    s.counters.push((n, secret.to_string()));
                }
            }
        }
        s
    }

    /// The last counter, 0 before the first.
    pub fn last(&self) -> u64 {
        self.counters.last().map_or(0, |c| c.0)
    }

    /// Why this is not one guest run carrying `secret` (one boot, counters 1, 2, 3, ...
    /// with no restart or gap, every line with that secret); `None` when it is.
    pub fn not_one_run_of(&self, secret: &str) -> Option<String> {
        if self.boots != 1 {
            return Some(format!("{} boot lines", self.boots));
        }
        if let Some((i, (n, _))) = (1u64..).zip(&self.counters).find(|(i, c)| c.0 != *i) {
            return Some(format!("counter line {i} says {n} (a restart or a gap)"));
        }
        self.counters
            .iter()
            .find(|c| c.1 != secret)
            .map(|c| format!("counter {} has secret {} instead of {secret}", c.0, c.1))
    }
}
