//! Answering a registry's authentication challenge (`WWW-Authenticate` on a `401`):
//! `Bearer` gets a token from the challenge's realm (anonymous, with basic credentials,
//! or with an identity token's OAuth refresh), kept per repository until shortly before
//! it expires; `Basic` gets the credentials. And `forkd login`'s check, done the way
//! `docker login` does it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::auth::Credential;
use crate::client::Client;
use crate::config::Endpoint;
use crate::error::RegistryError;
use crate::http::{authority, encode, excerpt, header, lock, Call, Token};
use crate::reference::Reference;

/// The parameters of a `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: HashMap<String, String>,
}

fn parse_challenge(h: &str) -> Option<Challenge> {
    let h = h.trim();
    let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() || chars.next() != Some('=') {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

impl Client {
    /// What the next request to the endpoint sends: a fresh bearer token for its
    /// repository, or the registry's basic credentials once a challenge asked for them.
    pub(crate) fn cached_auth(&self, ep: &Endpoint) -> Option<String> {
        let tokens = lock(&self.tokens);
        let repo = (
            ep.reference.registry.clone(),
            ep.reference.repository.clone(),
        );
        if let Some(t) = tokens.get(&repo).filter(|t| t.until > Instant::now()) {
            return Some(t.header.clone());
        }
        tokens
            .get(&(ep.reference.registry.clone(), String::new()))
            .map(|t| t.header.clone())
    }

    /// Answers a challenge: stores what the next request sends.
    pub(crate) fn authenticate(
        &self,
        call: &Call<'_>,
        challenge: &str,
        cred: &Option<Credential>,
    ) -> Result<(), RegistryError> {
        let ep = call.endpoint;
        let auth_err = |status: u16, reason: String| RegistryError::Auth {
            reference: call.reference(),
            status,
            reason,
        };
        let Some(ch) = parse_challenge(challenge) else {
            return Err(auth_err(401, format!("unreadable challenge {challenge:?}")));
        };
        let basic_of = |c: &Credential| {
            use base64::Engine as _;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.secret))
            )
        };
        match ch.scheme.as_str() {
            "basic" => {
                let Some(c) = cred else {
                    return Err(auth_err(401, self.no_credentials(ep)));
                };
                lock(&self.tokens).insert(
                    (ep.reference.registry.clone(), String::new()),
                    Token {
                        header: basic_of(c),
                        until: Instant::now() + Duration::from_secs(365 * 24 * 3600),
                    },
                );
                Ok(())
            }
            "bearer" => {
                let realm = ch
                    .params
                    .get("realm")
                    .ok_or_else(|| auth_err(401, "a Bearer challenge without a realm".into()))?;
                let scope = format!("repository:{}:pull", ep.reference.repository);
                let mut query = format!("scope={}", encode(&scope));
                if let Some(s) = ch.params.get("service") {
                    query = format!("service={}&{query}", encode(s));
                }
                let url = if realm.contains('?') {
                    format!("{realm}&{query}")
                } else {
                    format!("{realm}?{query}")
                };
                let token_host = authority(realm).to_owned();
                let agent = self.agent(&token_host, !ep.insecure)?;
                let transport = |e: ureq::Error| RegistryError::Transport {
                    reference: call.reference(),
                    step: "token".into(),
                    url: realm.clone(),
                    reason: e.to_string(),
                };
                let resp = match cred {
                    Some(c) if c.identity_token => {
                        let mut form = format!(
                            "grant_type=refresh_token&client_id=forkd&refresh_token={}&scope={}",
                            encode(&c.secret),
                            encode(&scope)
                        );
                        if let Some(s) = ch.params.get("service") {
                            form.push_str(&format!("&service={}", encode(s)));
                        }
                        agent
                            .post(realm.as_str())
                            .content_type("application/x-www-form-urlencoded")
                            .send(form.as_bytes())
                            .map_err(transport)?
                    }
                    Some(c) => agent
                        .get(&url)
                        .header("Authorization", basic_of(c))
                        .call()
                        .map_err(transport)?,
                    None => agent.get(&url).call().map_err(transport)?,
                };
                let status = resp.status().as_u16();
                if status == 401 || status == 403 {
                    let why = match cred {
                        Some(c) => format!("bad credentials from {}", c.from),
                        None => self.no_credentials(ep),
                    };
                    return Err(auth_err(status, why));
                }
                if status != 200 {
                    return Err(RegistryError::Http {
                        reference: call.reference(),
                        step: "token".into(),
                        url: realm.clone(),
                        status,
                        detail: excerpt(resp),
                    });
                }
                #[derive(serde::Deserialize)]
                struct Answer {
                    #[serde(default)]
                    token: Option<String>,
                    #[serde(default)]
                    access_token: Option<String>,
                    #[serde(default)]
                    expires_in: Option<u64>,
                }
                let bytes = resp
                    .into_body()
                    .with_config()
                    .limit(1 << 20)
                    .read_to_vec()
                    .map_err(transport)?;
                let a: Answer =
                    serde_json::from_slice(&bytes).map_err(|e| RegistryError::Invalid {
                        reference: call.reference(),
                        what: format!("token from {realm}"),
                        reason: e.to_string(),
                    })?;
                let token = a
                    .access_token
                    .or(a.token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| RegistryError::Invalid {
                        reference: call.reference(),
                        what: format!("token from {realm}"),
                        reason: "no token in the answer".into(),
                    })?;
                // Renewed a little before it expires; 60 s when the server does not say.
                let life = a.expires_in.unwrap_or(60).max(10);
                lock(&self.tokens).insert(
                    (
                        ep.reference.registry.clone(),
                        ep.reference.repository.clone(),
                    ),
                    Token {
                        header: format!("Bearer {token}"),
                        until: Instant::now() + Duration::from_secs(life - life / 10),
                    },
                );
                Ok(())
            }
            other => Err(auth_err(
                401,
                format!("unsupported authentication scheme {other:?}"),
            )),
        }
    }

    pub(crate) fn no_credentials(&self, ep: &Endpoint) -> String {
        if self.config.given.is_some() {
            return format!(
                "the registry {} wants credentials and the request brought none for it (its caller's credential files have none: `forkd login {}` stores some)",
                ep.reference.registry, ep.reference.registry
            );
        }
        let files: Vec<String> = self
            .config
            .auth
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!(
            "the registry {} wants credentials and none were found (looked in {}; `forkd login {}` stores some)",
            ep.reference.registry,
            if files.is_empty() { "no files".into() } else { files.join(", ") },
            ep.reference.registry
        )
    }
    /// Checks credentials against a registry as `docker login` does: `GET /v2/`, and for
    /// a bearer challenge a token for no repository. `Ok` when the registry accepts them
    /// (or asks for none).
    pub fn check_login(&self, registry: &str, cred: &Credential) -> Result<(), RegistryError> {
        let probe = Reference {
            registry: registry.to_owned(),
            repository: "forkd-login".into(),
            tag: None,
            digest: None,
        };
        let endpoint = self
            .config
            .registries
            .endpoints(&probe)?
            .pop()
            .expect("the registry itself is always last");
        let call = Call {
            endpoint: &endpoint,
            step: "login",
        };
        let shown = registry.to_owned();
        let transport = |url: &str, e: ureq::Error| RegistryError::Transport {
            reference: shown.clone(),
            step: "login".into(),
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let base = self.base_url(&call)?;
        let url = format!("{base}/v2/");
        let resp = self
            .send_once(&call, "GET", &url, &[], None)
            .map_err(|e| transport(&url, e))?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let bad = |status: u16| RegistryError::Auth {
            reference: shown.clone(),
            status,
            reason: format!("bad credentials for {} ({})", cred.username, cred.from),
        };
        let challenge = header(&resp, "www-authenticate").and_then(parse_challenge);
        let basic = {
            use base64::Engine as _;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", cred.username, cred.secret))
            )
        };
        match challenge {
            Some(ch) if ch.scheme == "bearer" => {
                let realm = ch.params.get("realm").cloned().unwrap_or_default();
                let mut url = realm.clone();
                if let Some(svc) = ch.params.get("service") {
                    url.push(if url.contains('?') { '&' } else { '?' });
                    url.push_str(&format!("service={}", encode(svc)));
                }
                let agent = self.agent(authority(&realm), !endpoint.insecure)?;
                let resp = agent
                    .get(&url)
                    .header("Authorization", &basic)
                    .call()
                    .map_err(|e| transport(&realm, e))?;
                match resp.status().as_u16() {
                    200 => Ok(()),
                    s => Err(bad(s)),
                }
            }
            Some(ch) if ch.scheme == "basic" => {
                let resp = self
                    .send_once(&call, "GET", &url, &[], Some(&basic))
                    .map_err(|e| transport(&url, e))?;
                match resp.status().as_u16() {
                    200 => Ok(()),
                    s => Err(bad(s)),
                }
            }
            _ => Err(RegistryError::Http {
                reference: shown.clone(),
                step: "login".into(),
                url,
                status,
                detail: excerpt(resp),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.example/token");
        assert_eq!(c.params["scope"], "repository:a/b:pull,push");
        let c = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.params["realm"], "Registry Realm");
    }
}
