//! forkd-cgroups
