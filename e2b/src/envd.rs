//! envd, the in-sandbox API, served by forkd itself: no E2B program is put in the
//! sandbox (forkd's own init, which every sandbox has, carries out its file operations
//! and watches), so it works with any image. A request names its sandbox
//! (`E2b-Sandbox-Id`, or a Host name), proves it may use it (`X-Access-Token`, or a
//! signed `/files` URL), and is then carried out with forkd's API as the key that made
//! the sandbox.
//!
//! Here: that routing and authentication, what is read of a sandbox once (its users'
//! homes, its environment), `/health` and `/files`; the target's users and paths are
//! `rpc.rs`'s.

use crate::connect::{Code, Error};
use crate::rpc::{unary_error, Target};
use crate::{
    blocking, failure, json, labels, query, rest_error, Body, Forkd, Gateway, SandboxFacts,
};
use forkd_api::client::Client;
use forkd_api::{SandboxInfo, SandboxStatus};
use std::collections::HashMap;
use std::sync::Arc;

pub fn is_envd_path(path: &str) -> bool {
    path == "/files"
        || path == "/health"
        || path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/")
}

type Answer = hyper::Response<Body>;

/// An envd request that names no sandbox.
pub fn refuse_unnamed() -> Answer {
    rest_error(
        400,
        "an envd request names its sandbox: send E2b-Sandbox-Id (the SDK does, with E2B_SANDBOX_URL set)",
    )
}

/// The message of a sandbox that is gone, in the words the SDK looks for.
fn not_found_message(id: &str) -> String {
    format!("The sandbox {id} was not found")
}

pub async fn serve(
    gw: Arc<Gateway>,
    forkd: Arc<dyn Forkd>,
    id: String,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
    let rpc = req.uri().path().contains('.');
    let gone = |id: &str| {
        if rpc {
            unary_error(&Error::new(Code::Unavailable, not_found_message(id)))
        } else {
            rest_error(502, not_found_message(id))
        }
    };
    let loaded = {
        let (gw, id) = (gw.clone(), id.clone());
        blocking(move || load(&gw, &*forkd, &id)).await
    };
    let target = match loaded {
        Ok(Ok(t)) => t,
        Ok(Err(_)) | Err(_) => return gone(&id),
    };
    let q = query(req.uri());
    if let Err(message) = authorize(&target, &req, &q) {
        return if rpc {
            unary_error(&Error::new(Code::Unauthenticated, message))
        } else {
            rest_error(401, message)
        };
    }
    let basic = basic_user(req.headers());
    let path = req.uri().path().to_string();
    let method = req.method().as_str().to_string();
    if let Some(m) = path.strip_prefix("/process.Process/") {
        let m = m.to_string();
        return crate::process::serve(gw, target, basic, &m, req).await;
    }
    if let Some(m) = path.strip_prefix("/filesystem.Filesystem/") {
        let m = m.to_string();
        return crate::filesystem::serve(gw, target, basic, &m, req).await;
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/health") => {
            let t = target.clone();
            match blocking(move || inspect(&t.client, &t.id)).await {
                Ok(Ok(sb)) if sb.status == SandboxStatus::Running => crate::empty(204),
                _ => gone(&id),
            }
        }
        ("GET", "/files") => read_file(target, q).await,
        ("POST", "/files") => write_files(gw, target, q, req).await,
        _ => rest_error(404, format!("envd has no {method} {path}")),
    }
}

fn inspect(client: &Client, id: &str) -> Result<SandboxInfo, (u16, String)> {
    let path = format!("/v1/sandboxes/{}", forkd_api::url::encode(id));
    client.call("GET", &path, None).map_err(|e| failure(&e))
}

/// The sandbox `id` as its owner sees it, and its facts (read once, then kept).
fn load(gw: &Gateway, forkd: &dyn Forkd, id: &str) -> Result<Target, String> {
    let client = forkd.as_owner_of(id)?;
    if let Some(facts) = gw.sandboxes.get(id) {
        return Ok(Target {
            id: id.to_string(),
            client,
            facts,
        });
    }
    let sb = inspect(&client, id).map_err(|(_, m)| m)?;
    if sb.status != SandboxStatus::Running {
        return Err(format!("sandbox {id} is not running"));
    }
    let Some(secret) = sb.labels.get(labels::SECRET) else {
        return Err(format!("sandbox {id} was not made through E2B's API"));
    };
    let token = crate::access_token(secret, &sb.id);
    let passwd = client
        .raw(
            "GET",
            &format!(
                "/v1/sandboxes/{}/file?path=/etc/passwd",
                forkd_api::url::encode(&sb.id)
            ),
            &[],
        )
        .map(|r| if r.status == 200 { r.body } else { Vec::new() })
        .unwrap_or_default();
    let homes = homes(&String::from_utf8_lossy(&passwd));
    // E2B's templates run commands as `user`; an image without one runs them as root.
    let user = if homes.contains_key("user") {
        "user"
    } else {
        "root"
    };
    let envs = sb
        .labels
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(labels::ENV)?.to_string(), v.clone())))
        .collect();
    let facts = Arc::new(SandboxFacts {
        token,
        user: user.to_string(),
        homes,
        envs,
    });
    gw.sandboxes.put(&sb.id, facts.clone());
    Ok(Target {
        id: sb.id,
        client,
        facts,
    })
}

/// Users' homes in a passwd file.
fn homes(passwd: &str) -> HashMap<String, String> {
    passwd
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 6 && !f[0].is_empty()).then(|| (f[0].to_string(), f[5].to_string()))
        })
        .collect()
}

/// Checks the request's right to the sandbox: its access token, or for `/files` a
/// signature made with it.
fn authorize(
    t: &Target,
    req: &hyper::Request<hyper::body::Incoming>,
    q: &HashMap<String, String>,
) -> Result<(), String> {
    if let Some(given) = req
        .headers()
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
    {
        return if crate::same(given.trim(), &t.facts.token) {
            Ok(())
        } else {
            Err(format!("the access token is not sandbox {}'s", t.id))
        };
    }
    if req.uri().path() == "/files" {
        if let Some(sig) = q.get("signature") {
            let op = if req.method() == hyper::Method::GET {
                "read"
            } else {
                "write"
            };
            return check_signature(t, q, op, sig);
        }
    }
    Err(format!(
        "sandbox {} needs its access token: send X-Access-Token (the create reply's envdAccessToken)",
        t.id
    ))
}

/// A signed `/files` URL: `v1_` and the unpadded base64 of the SHA-256 of
/// `path:operation:user:token[:expiration]`, not past its expiration.
fn check_signature(
    t: &Target,
    q: &HashMap<String, String>,
    op: &str,
    sig: &str,
) -> Result<(), String> {
    let path = q.get("path").map(String::as_str).unwrap_or("");
    let user = q.get("username").map(String::as_str).unwrap_or("");
    let expiration = q.get("signature_expiration").filter(|e| !e.is_empty());
    let raw = match expiration {
        None => format!("{path}:{op}:{user}:{}", t.facts.token),
        Some(e) => {
            let at: u64 = e
                .parse()
                .map_err(|_| format!("signature_expiration {e:?} is not a time"))?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            if at < now {
                return Err("the signed URL has expired".into());
            }
            format!("{path}:{op}:{user}:{}:{at}", t.facts.token)
        }
    };
    use sha2::Digest;
    let digest = sha2::Sha256::digest(raw.as_bytes());
    let want = format!(
        "v1_{}",
        forkd_api::b64::encode(&digest).trim_end_matches('=')
    );
    if crate::same(sig, &want) {
        Ok(())
    } else {
        Err(format!("the signature does not sign {op} of {path:?}"))
    }
}

/// The user of `Authorization: Basic base64("<user>:")`, the SDK's way of naming one.
fn basic_user(headers: &hyper::HeaderMap) -> Option<String> {
    let v = headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    let b = v
        .strip_prefix("Basic ")
        .or_else(|| v.strip_prefix("basic "))?;
    let raw = forkd_api::b64::decode(b.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let user = text.split(':').next()?.to_string();
    (!user.is_empty()).then_some(user)
}

/// forkd's path of a file of the sandbox. Like E2B's envd, which runs as root, this
/// layer reads and writes as root; a file it writes (and the directories made for it)
/// is given to `owner`, the request's user.
fn file_path(t: &Target, path: &str, owner: Option<&str>) -> String {
    let mut p = format!(
        "/v1/sandboxes/{}/file?path={}",
        forkd_api::url::encode(&t.id),
        forkd_api::url::encode(path)
    );
    if let Some(o) = owner {
        p.push_str(&format!("&owner={}", forkd_api::url::encode(o)));
    }
    p
}

/// `GET /files?path=&username=`: the file's bytes.
async fn read_file(t: Target, q: HashMap<String, String>) -> Answer {
    let user = t.user(q.get("username").map(String::as_str)).to_string();
    let Some(path) = q.get("path").filter(|p| !p.is_empty()) else {
        return rest_error(400, "path is required");
    };
    let path = t.path(&user, path);
    let answer = blocking(move || t.client.raw("GET", &file_path(&t, &path, None), &[])).await;
    match answer {
        Ok(Ok(r)) if r.status == 200 => crate::with_type(200, "application/octet-stream", r.body),
        Ok(Ok(r)) => {
            let (status, message) = failure(&Client::api_error(&r));
            rest_error(status, message)
        }
        Ok(Err(e)) => {
            let (status, message) = failure(&e);
            rest_error(status, message)
        }
        Err(e) => rest_error(500, e),
    }
}

/// `POST /files`: multipart parts named `file`, each with its destination as its file
/// name (or `?path=` for one), or one octet-stream body for `?path=`; gzip allowed.
async fn write_files(
    gw: Arc<Gateway>,
    t: Target,
    q: HashMap<String, String>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Answer {
    let user = t.user(q.get("username").map(String::as_str)).to_string();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzip = req
        .headers()
        .get(hyper::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let limit = gw.settings.max_body;
    let body = match crate::read_body(req.into_body(), limit).await {
        Ok(b) => b,
        Err(e) => return rest_error(400, e),
    };
    let body = if gzip {
        match gunzip(&body, limit) {
            Ok(b) => b,
            Err(e) => return rest_error(400, e),
        }
    } else {
        body
    };
    let query_path = q.get("path").filter(|p| !p.is_empty()).cloned();
    let files: Vec<(String, Vec<u8>)> = if content_type.starts_with("multipart/form-data") {
        match multipart(&content_type, body).await {
            Ok(parts) if parts.len() == 1 && query_path.is_some() => {
                vec![(query_path.unwrap(), parts.into_iter().next().unwrap().1)]
            }
            Ok(parts) => parts,
            Err(e) => return rest_error(400, e),
        }
    } else {
        match query_path {
            Some(p) => vec![(p, body)],
            None => return rest_error(400, "path is required for an octet-stream upload"),
        }
    };
    if files.is_empty() {
        return rest_error(400, "the upload holds no file");
    }
    let answer = blocking(move || {
        let mut out = Vec::new();
        for (path, data) in files {
            let path = t.path(&user, &path);
            let r = t
                .client
                .raw("PUT", &file_path(&t, &path, Some(&user)), &data)
                .map_err(|e| failure(&e))?;
            if r.status != 200 {
                return Err(failure(&Client::api_error(&r)));
            }
            let name = path.rsplit('/').next().unwrap_or("").to_string();
            out.push(serde_json::json!({ "name": name, "type": "file", "path": path }));
        }
        Ok(out)
    })
    .await;
    match answer {
        Ok(Ok(entries)) => json(200, &serde_json::Value::Array(entries)),
        Ok(Err((status, message))) => rest_error(status, message),
        Err(e) => rest_error(500, e),
    }
}

fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("the gzip body does not decompress: {e}"))?;
    if out.len() > limit {
        return Err(format!(
            "the upload is over the limit of {limit} bytes once decompressed"
        ));
    }
    Ok(out)
}

/// The `file` parts of a multipart body: (file name, bytes).
async fn multipart(content_type: &str, body: Vec<u8>) -> Result<Vec<(String, Vec<u8>)>, String> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| format!("Content-Type {content_type:?}: {e}"))?;
    let stream = futures_util::stream::once(async move {
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(body))
    });
    let mut m = multer::Multipart::new(stream, boundary);
    let mut out = Vec::new();
    while let Some(field) = m
        .next_field()
        .await
        .map_err(|e| format!("multipart body: {e}"))?
    {
        if field.name() != Some("file") {
            continue;
        }
        let name = field
            .file_name()
            .map(str::to_string)
            .filter(|n| !n.is_empty())
            .ok_or("a multipart part named file has no file name (its destination)")?;
        let data = field
            .bytes()
            .await
            .map_err(|e| format!("multipart part {name}: {e}"))?;
        out.push((name, data.to_vec()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        let homes =
            homes("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n");
        Target {
            id: "abc".into(),
            client: Client::new(std::path::Path::new("/nonexistent")),
            facts: Arc::new(SandboxFacts {
                token: "t0k".into(),
                user: "user".into(),
                homes,
                envs: Vec::new(),
            }),
        }
    }

    #[test]
    fn relative_paths_are_in_the_users_home() {
        let t = target();
        assert_eq!(t.path("user", "a/b"), "/home/user/a/b");
        assert_eq!(t.path("root", "./x"), "/root/x");
        assert_eq!(t.path("user", "."), "/home/user");
        assert_eq!(t.path("user", "/etc/x"), "/etc/x");
        assert_eq!(t.user(None), "user");
        assert_eq!(t.user(Some("root")), "root");
    }

    #[test]
    fn signatures_sign_path_operation_user_and_token() {
        use sha2::Digest;
        let t = target();
        let sign = |raw: &str| {
            format!(
                "v1_{}",
                forkd_api::b64::encode(&sha2::Sha256::digest(raw.as_bytes())).trim_end_matches('=')
            )
        };
        let mut q = HashMap::new();
        q.insert("path".to_string(), "/home/user/f".to_string());
        let good = sign("/home/user/f:read::t0k");
        assert!(check_signature(&t, &q, "read", &good).is_ok());
        assert!(check_signature(&t, &q, "write", &good).is_err());
        let later = u64::MAX / 2;
        q.insert("signature_expiration".into(), later.to_string());
        let timed = sign(&format!("/home/user/f:read::t0k:{later}"));
        assert!(check_signature(&t, &q, "read", &timed).is_ok());
        q.insert("signature_expiration".into(), "5".into());
        let past = sign("/home/user/f:read::t0k:5");
        let e = check_signature(&t, &q, "read", &past).unwrap_err();
        assert!(e.contains("expired"), "{e}");
    }

    #[test]
    fn the_basic_header_names_the_user() {
        let mut h = hyper::HeaderMap::new();
        h.insert(
            hyper::header::AUTHORIZATION,
            "Basic cm9vdDo=".parse().unwrap(),
        );
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        h.insert(hyper::header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(basic_user(&h), None);
    }
}
