//! The exec frame decoder on arbitrary bytes: frames or an error, never a panic, and
//! every frame it reads re-encodes to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use forkd_sandbox::proto;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    loop {
        let before = r;
        match proto::read_frame(&mut r) {
            Ok(Some((kind, payload))) => {
                let mut again = Vec::new();
                proto::write_frame(&mut again, kind, &payload).expect("encode");
                assert_eq!(again.as_slice(), &before[..before.len() - r.len()]);
            }
            Ok(None) | Err(_) => break,
        }
    }
});
