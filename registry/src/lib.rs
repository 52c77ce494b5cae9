//! forkd-registry: the client side of the OCI distribution API, for `forkd image pull`.
//!
//! - [`reference`]: image references, parsed and fully qualified;
//! - [`config`]: `registries.conf` (mirrors, insecure and blocked registries, search
//!   registries, short-name aliases);
//! - [`auth`]: credentials from the containers auth file and Docker's config (and their
//!   helpers), and `forkd login`'s writes;
//! - [`manifest`]: manifests, indexes, platforms and layer media types;
//! - [`client`]: requests with retries and redirects that keep credentials on their
//!   host, manifests resolved for a platform; `challenge`: authentication challenges
//!   and tokens; [`blob`]: streamed, resumable, verified blobs.
//!
//! This is the one crate that speaks HTTP to the world outside the machine. It is
//! blocking (its callers run it on worker threads) and knows nothing of the layer
//! store: the daemon feeds its blob streams to `forkd-layers`.

#![forbid(unsafe_code)]

pub mod auth;
pub mod blob;
mod challenge;
pub mod client;
pub mod config;
pub mod error;
mod http;
pub mod manifest;
pub mod reference;

pub use blob::BlobReader;
pub use client::{Client, ClientConfig, Resolved};
pub use config::{Endpoint, RegistriesConf};
pub use error::RegistryError;
pub use http::RetryPolicy;
pub use manifest::{Compression, Platform};
pub use reference::{Digest, Parsed, Reference};
