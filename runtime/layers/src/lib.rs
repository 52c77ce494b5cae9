//! forkd-layers
