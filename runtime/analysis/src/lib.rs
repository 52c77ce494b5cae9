//! forkd-analysis
