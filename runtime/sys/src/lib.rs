//! forkd-sys
