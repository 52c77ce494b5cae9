//! Blobs as streams: nothing is held whole in memory.
//!
//! [`BlobReader`] counts and hashes what it hands out. A connection that drops (an
//! error, or an end before the size) is resumed with `Range: bytes=N-`; a server that
//! ignores the range has the first N bytes of its new answer read and dropped, so the
//! consumer sees one unbroken stream either way. At the end the digest is checked, and
//! a mismatch is an error of the read itself.

use std::io::{self, Read};
use std::time::Duration;

use sha2::Digest as _;
use ureq::http::StatusCode;

use crate::client::Client;
use crate::config::Endpoint;
use crate::error::RegistryError;
use crate::http::{backoff, excerpt, header, Call};
use crate::manifest::{self, Descriptor};
use crate::reference::{hex, Digest};

/// Resumes of one blob before it fails.
const MAX_RESUMES: u32 = 8;

impl Client {
    /// Fetches a small blob whole (an image config), verified.
    pub fn fetch_small(
        &self,
        ep: &Endpoint,
        d: &Descriptor,
        limit: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let shown = ep.reference.to_string();
        let digest = manifest::descriptor_digest(&shown, d)?;
        if d.size > limit {
            return Err(RegistryError::Invalid {
                reference: shown,
                what: format!("blob {digest}"),
                reason: format!("{} bytes, more than the {limit} allowed", d.size),
            });
        }
        let mut r = self.open_blob(ep, &digest, d.size)?;
        let mut out = Vec::with_capacity(d.size as usize);
        r.read_to_end(&mut out)
            .map_err(|e| RegistryError::Transport {
                reference: shown.clone(),
                step: format!("blob {digest}"),
                url: ep.reference.name(),
                reason: e.to_string(),
            })?;
        Ok(out)
    }

    /// Opens a streamed, resumable, verified read of a blob.
    pub fn open_blob(
        &self,
        ep: &Endpoint,
        digest: &Digest,
        size: u64,
    ) -> Result<BlobReader<'_>, RegistryError> {
        let mut r = BlobReader {
            client: self,
            endpoint: ep.clone(),
            digest: digest.clone(),
            size,
            body: None,
            skip: 0,
            offset: 0,
            hasher: sha2::Sha256::new(),
            resumes: 0,
            verified: false,
        };
        r.connect().map_err(|e| match e.into_inner() {
            Some(inner) => match inner.downcast::<RegistryError>() {
                Ok(re) => *re,
                Err(other) => RegistryError::Transport {
                    reference: ep.reference.to_string(),
                    step: format!("blob {digest}"),
                    url: ep.reference.name(),
                    reason: other.to_string(),
                },
            },
            None => RegistryError::Transport {
                reference: ep.reference.to_string(),
                step: format!("blob {digest}"),
                url: ep.reference.name(),
                reason: "connection failed".into(),
            },
        })?;
        Ok(r)
    }
}

/// A blob as a stream (see the module's header).
pub struct BlobReader<'c> {
    client: &'c Client,
    endpoint: Endpoint,
    digest: Digest,
    size: u64,
    body: Option<ureq::BodyReader<'static>>,
    /// Bytes of the current answer to drop before handing any out (a restart).
    skip: u64,
    offset: u64,
    hasher: sha2::Sha256,
    resumes: u32,
    verified: bool,
}

impl BlobReader<'_> {
    /// Bytes handed out so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Times the connection was resumed.
    pub fn resumes(&self) -> u32 {
        self.resumes
    }

    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// (Re)connects at the current offset.
    fn connect(&mut self) -> io::Result<()> {
        let call = Call {
            endpoint: &self.endpoint,
            step: "blob",
        };
        let mut headers = Vec::new();
        if self.offset > 0 {
            headers.push(("Range", format!("bytes={}-", self.offset)));
        }
        let resp = self
            .client
            .request(&call, "GET", &format!("blobs/{}", self.digest), &headers)
            .map_err(io::Error::other)?;
        let status = resp.status();
        let wanted_range = self.offset > 0;
        self.skip = 0;
        if status == StatusCode::PARTIAL_CONTENT {
            let start = header(&resp, "content-range")
                .and_then(|r| r.strip_prefix("bytes "))
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse::<u64>().ok());
            if start != Some(self.offset) {
                return Err(io::Error::other(RegistryError::Invalid {
                    reference: self.endpoint.reference.to_string(),
                    what: format!("blob {}", self.digest),
                    reason: format!(
                        "asked for bytes from {} and got a range from {start:?}",
                        self.offset
                    ),
                }));
            }
        } else if status == StatusCode::OK {
            // The whole blob again: a server that ignores ranges. Drop what was read.
            if wanted_range {
                self.skip = self.offset;
            }
        } else {
            let s = status.as_u16();
            let err = if s == 404 {
                RegistryError::Invalid {
                    reference: self.endpoint.reference.to_string(),
                    what: format!("blob {}", self.digest),
                    reason: "blob unknown to the registry".into(),
                }
            } else {
                RegistryError::Http {
                    reference: self.endpoint.reference.to_string(),
                    step: format!("blob {}", self.digest),
                    url: format!("{}/blobs/{}", self.endpoint.reference.name(), self.digest),
                    status: s,
                    detail: excerpt(resp),
                }
            };
            return Err(io::Error::other(err));
        }
        self.body = Some(resp.into_body().into_reader());
        Ok(())
    }

    fn check_end(&mut self) -> io::Result<()> {
        if self.verified {
            return Ok(());
        }
        let actual = hex(&std::mem::take(&mut self.hasher).finalize());
        self.verified = true;
        if actual != self.digest.hex() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                RegistryError::Mismatch {
                    reference: self.endpoint.reference.to_string(),
                    what: "blob".into(),
                    expected: self.digest.to_string(),
                    actual: format!("sha256:{actual}"),
                },
            ));
        }
        Ok(())
    }

    /// Reads what is left and checks the digest.
    pub fn finish(&mut self) -> io::Result<()> {
        io::copy(self, &mut io::sink())?;
        self.check_end()
    }

    fn resume_after(&mut self, why: io::Error) -> io::Result<()> {
        self.body = None;
        self.resumes += 1;
        if self.resumes > MAX_RESUMES {
            return Err(io::Error::new(
                why.kind(),
                format!(
                    "blob {}: gave up after {MAX_RESUMES} resumes: {why}",
                    self.digest
                ),
            ));
        }
        std::thread::sleep(
            backoff(&self.client.config.retry, self.resumes).min(Duration::from_secs(5)),
        );
        self.connect()
    }
}

impl Read for BlobReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.offset >= self.size {
                self.check_end()?;
                return Ok(0);
            }
            if buf.is_empty() {
                return Ok(0);
            }
            if self.body.is_none() {
                if let Err(e) = self.connect() {
                    self.resume_after(e)?;
                    continue;
                }
            }
            let body = self.body.as_mut().expect("connected");
            if self.skip > 0 {
                let mut scratch = [0u8; 16384];
                let n = (self.skip as usize).min(scratch.len());
                match body.read(&mut scratch[..n]) {
                    Ok(0) => {
                        let e = io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the connection ended early",
                        );
                        self.resume_after(e)?;
                    }
                    Ok(k) => self.skip -= k as u64,
                    Err(e) => self.resume_after(e)?,
                }
                continue;
            }
            let room = ((self.size - self.offset) as usize).min(buf.len());
            match body.read(&mut buf[..room]) {
                Ok(0) => {
                    let e = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the connection ended at byte {} of {}",
                            self.offset, self.size
                        ),
                    );
                    self.resume_after(e)?;
                }
                Ok(n) => {
                    self.hasher.update(&buf[..n]);
                    self.offset += n as u64;
                    return Ok(n);
                }
                Err(e) => self.resume_after(e)?,
            }
        }
    }
}
