//! The Connect envelope reader (E2B's envd streams) on arbitrary bytes: envelopes or an
//! error naming the problem, never a panic; what it reads re-encodes to the bytes it
//! came from, and a one-message request is what the streaming calls take.
#![no_main]

use forkd_e2b::connect;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match connect::envelopes(data) {
        Ok(all) => {
            let mut again = Vec::new();
            for e in &all {
                let flags = if e.end { connect::END_STREAM } else { 0 };
                again.extend(connect::envelope(flags, e.message));
            }
            assert_eq!(again.as_slice(), data);
            let one = connect::request_message(data);
            assert_eq!(one.is_ok(), all.len() == 1 && !all[0].end);
        }
        Err(e) => {
            let _ = e.to_string();
            assert!(connect::request_message(data).is_err());
        }
    }
});
