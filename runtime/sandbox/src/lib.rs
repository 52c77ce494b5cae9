//! forkd-sandbox
