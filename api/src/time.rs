//! Times as RFC 3339 text (UTC), without a calendar crate.

/// RFC 3339 (UTC) of a Unix time with nanoseconds (left out when zero).
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}")
    };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}{frac}Z")
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_and_times() {
        assert_eq!(super::rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_796_601_599, 0), "2026-12-06T23:59:59Z");
        assert_eq!(
            super::rfc3339(1_700_000_000, 5),
            "2023-11-14T22:13:20.000000005Z"
        );
    }
}
