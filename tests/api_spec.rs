//! Checks `docs/openapi.json` against the implementation, without a daemon:
//!
//! - the document's operations are exactly `forkd::api::Operation::ALL`'s specs (method,
//!   path, id), and every path parameter of a template is declared;
//! - serialising the API's response types yields exactly the properties their schemas
//!   list, with matching types, and every `required` property;
//! - JSON built from the request schemas deserialises into the request types and
//!   serialises back unchanged; `required` and `additionalProperties: false` match what
//!   the types accept;
//! - each operation's spec (success status, request body, answer, query parameters with
//!   whether they are required) is what the document says; the daemon's router answers
//!   from that spec and its handlers can read only the query parameters it declares;
//! - the branch modes (`ForkMode`) and the phase names (`CHECKPOINT_PHASES`,
//!   `FORK_PHASES`, the only ones the daemon can record) are the ones the document lists.
//!
//! No source file is read: what is checked is the types and tables of `forkd::api`.

#![forbid(unsafe_code)]

use forkd::api::{
    self, Answer, ApiError, ArchivePath, BranchInfo, BuildRequest, BuildResult, BuildStatus,
    BuildStep, CheckpointInfo, CheckpointRequest, CopyResult, CreateSandboxRequest, DetachedExec,
    ErrorKind, ExecBody, ExecRecord, ExecResult, ExportRequest, ExportResult, ForkMode,
    ForkRequest, ForkResult, GcResult, GrantInfo, GrantRequest, ImageConfig, ImageInfo,
    ImportImageRequest, OpStats, Operation, Refusal, Removed, RequestBody, SandboxInfo,
    SandboxStatus, StopRequest, VersionInfo,
};
use forkd_cgroups::Limits;
use forkd_sandbox::proto::{ExecExit, ExecRequest, ExecStarted};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

fn doc() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Follows `$ref`s (local ones only).
fn follow<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..32 {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let pointer = r
                    .strip_prefix('#')
                    .unwrap_or_else(|| panic!("non-local $ref {r}"));
                v = doc
                    .pointer(pointer)
                    .unwrap_or_else(|| panic!("dangling $ref {r}"));
            }
            None => return v,
        }
    }
    panic!("$ref cycle")
}

/// A schema with `$ref`s and single-element `allOf`s resolved, and whether null is allowed.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> (&'a Value, bool) {
    let mut s = schema;
    let mut nullable = false;
    loop {
        nullable |= s.get("nullable").and_then(Value::as_bool).unwrap_or(false);
        if s.get("$ref").is_some() {
            s = follow(doc, s);
            continue;
        }
        match s.get("allOf").and_then(Value::as_array) {
            Some(all) if all.len() == 1 => s = &all[0],
            Some(all) => panic!("allOf with {} entries is not supported here", all.len()),
            None => return (s, nullable),
        }
    }
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc.pointer(&format!("/components/schemas/{name}"))
        .unwrap_or_else(|| panic!("components.schemas.{name} is missing"))
}

fn names(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn required(s: &Value) -> BTreeSet<String> {
    s.get("required")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().expect("required entry").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks `value` against `schema`: property names exactly (response bodies are always
/// serialised in full), `required`, types, enums, nullability; recursing into objects,
/// maps and arrays.
fn check_value(doc: &Value, schema: &Value, value: &Value, at: &str, errs: &mut Vec<String>) {
    let (s, nullable) = resolve(doc, schema);
    if value.is_null() {
        if !nullable {
            errs.push(format!("{at}: null, but the schema is not nullable"));
        }
        return;
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            errs.push(format!("{at}: {value} is not in the enum {allowed:?}"));
        }
    }
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "object" => {
            let Some(obj) = value.as_object() else {
                errs.push(format!("{at}: expected an object, got {value}"));
                return;
            };
            let keys: BTreeSet<String> = obj.keys().cloned().collect();
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                let listed: BTreeSet<String> = props.keys().cloned().collect();
                for missing in listed.difference(&keys) {
                    errs.push(format!(
                        "{at}: schema lists property {missing:?}, the serialised value lacks it"
                    ));
                }
                for extra in keys.difference(&listed) {
                    errs.push(format!(
                        "{at}: serialised value has property {extra:?}, the schema does not list it"
                    ));
                }
                for (k, v) in obj {
                    if let Some(p) = props.get(k) {
                        check_value(doc, p, v, &format!("{at}.{k}"), errs);
                    }
                }
            } else if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
                for (k, v) in obj {
                    check_value(doc, ap, v, &format!("{at}[{k:?}]"), errs);
                }
            }
            for r in required(s).difference(&keys) {
                errs.push(format!("{at}: required property {r:?} is not serialised"));
            }
        }
        "array" => match value.as_array() {
            Some(items) => {
                for (i, v) in items.iter().enumerate() {
                    check_value(doc, &s["items"], v, &format!("{at}[{i}]"), errs);
                }
            }
            None => errs.push(format!("{at}: expected an array, got {value}")),
        },
        "string" if !value.is_string() => {
            errs.push(format!("{at}: expected a string, got {value}"))
        }
        "boolean" if !value.is_boolean() => {
            errs.push(format!("{at}: expected a boolean, got {value}"))
        }
        "integer" => {
            if !(value.is_i64() || value.is_u64()) {
                errs.push(format!("{at}: expected an integer, got {value}"));
            } else if let Some(min) = s.get("minimum").and_then(Value::as_i64) {
                if value.as_i64().is_some_and(|n| n < min) {
                    errs.push(format!("{at}: {value} is below the minimum {min}"));
                }
            }
        }
        "string" | "boolean" => {}
        other => errs.push(format!("{at}: unsupported schema type {other:?}")),
    }
}

/// Serialises `value` and checks it against the named schema.
fn check_serialised<T: Serialize>(doc: &Value, name: &str, value: &T) {
    let v = serde_json::to_value(value).expect("serialise");
    let mut errs = Vec::new();
    check_value(
        doc,
        &json!({ "$ref": format!("#/components/schemas/{name}") }),
        &v,
        name,
        &mut errs,
    );
    assert!(
        errs.is_empty(),
        "{name} does not match its schema:\n  {}\nvalue: {v}",
        errs.join("\n  ")
    );
}

/// A value for `schema` with every property present and non-null.
fn sample(doc: &Value, schema: &Value) -> Value {
    let (s, _) = resolve(doc, schema);
    if let Some(first) = s
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return first.clone();
    }
    match s.get("type").and_then(Value::as_str) {
        Some("object") => match s.get("properties").and_then(Value::as_object) {
            Some(props) => Value::Object(
                props
                    .iter()
                    .map(|(k, p)| (k.clone(), sample(doc, p)))
                    .collect(),
            ),
            None => match s.get("additionalProperties").filter(|v| v.is_object()) {
                Some(ap) => json!({ "key": sample(doc, ap) }),
                None => json!({}),
            },
        },
        Some("array") => json!([sample(doc, &s["items"])]),
        Some("string") if s.get("format").and_then(Value::as_str) == Some("byte") => {
            json!("c2FtcGxl")
        }
        Some("string") => json!("sample"),
        Some("integer") => json!(7),
        Some("boolean") => json!(true),
        other => panic!("no sample for schema type {other:?}"),
    }
}

/// The request schema `name` against the type `T`: a full sample round-trips exactly;
/// only the `required` properties are needed; `additionalProperties: false` holds exactly
/// when the type rejects unknown properties.
fn check_request<T: Serialize + DeserializeOwned>(doc: &Value, name: &str) {
    let s = schema(doc, name);
    let full = sample(doc, s);
    let parsed: T = serde_json::from_value(full.clone())
        .unwrap_or_else(|e| panic!("{name}: the schema's full sample {full} is refused: {e}"));
    let back = serde_json::to_value(&parsed).expect("serialise");
    assert_eq!(
        back, full,
        "{name}: a sample built from the schema does not survive a round trip through the type"
    );

    let req = required(s);
    let minimal: Map<String, Value> = full
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| req.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Err(e) = serde_json::from_value::<T>(Value::Object(minimal.clone())) {
        panic!("{name}: only the required properties {req:?} should be enough: {e}");
    }
    for r in &req {
        let mut without = minimal.clone();
        without.remove(r);
        assert!(
            serde_json::from_value::<T>(Value::Object(without)).is_err(),
            "{name}: {r:?} is listed as required but the type accepts a body without it"
        );
    }
    for (k, _) in full.as_object().unwrap() {
        if !req.contains(k) {
            let mut without = full.as_object().unwrap().clone();
            without.remove(k);
            assert!(
                serde_json::from_value::<T>(Value::Object(without)).is_ok(),
                "{name}: {k:?} is not listed as required but the type needs it"
            );
        }
    }

    let mut unknown = full.as_object().unwrap().clone();
    unknown.insert("no_such_property".into(), json!(1));
    let rejected = serde_json::from_value::<T>(Value::Object(unknown)).is_err();
    let closed = s.get("additionalProperties") == Some(&json!(false));
    assert_eq!(
        rejected,
        closed,
        "{name}: the type {} unknown properties but the schema {}",
        if rejected { "rejects" } else { "accepts" },
        if closed {
            "sets additionalProperties: false"
        } else {
            "allows them"
        }
    );
}

/// Every operation in the document: (METHOD, path, operationId) -> operation object,
/// with the path item's parameters merged into `parameters`.
fn operations(doc: &Value) -> BTreeMap<(String, String, String), Value> {
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let shared = item.get("parameters").cloned().unwrap_or(json!([]));
        for (method, op) in item.as_object().unwrap() {
            if !METHODS.contains(&method.as_str()) {
                continue;
            }
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"))
                .to_string();
            let mut op = op.clone();
            let mut params = shared.as_array().unwrap().clone();
            params.extend(op["parameters"].as_array().cloned().unwrap_or_default());
            op["parameters"] = Value::Array(params);
            let key = (method.to_uppercase(), path.clone(), id);
            assert!(out.insert(key.clone(), op).is_none(), "{key:?} twice");
        }
    }
    out
}

fn op<'a>(ops: &'a BTreeMap<(String, String, String), Value>, id: &str) -> &'a Value {
    ops.iter()
        .find(|((_, _, i), _)| i == id)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("operation {id} is not in the document"))
}

/// (name, location, required) of an operation's parameters.
fn params(doc: &Value, op: &Value) -> BTreeSet<(String, String, bool)> {
    op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let p = follow(doc, p);
            (
                p["name"].as_str().expect("parameter name").to_string(),
                p["in"].as_str().expect("parameter in").to_string(),
                p.get("required").and_then(Value::as_bool).unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn document_is_openapi_3_0_3_for_this_api_version() {
    let doc = doc();
    assert_eq!(doc["openapi"], "3.0.3");
    assert_eq!(doc["info"]["version"], api::API_VERSION);
    for path in doc["paths"].as_object().unwrap().keys() {
        assert!(
            path.starts_with(&format!("/{}/", api::API_VERSION)),
            "{path} is outside /{}/",
            api::API_VERSION
        );
    }
}

#[test]
fn operations_are_exactly_the_route_table() {
    let doc = doc();
    let documented: BTreeSet<(String, String, String)> = operations(&doc).into_keys().collect();
    let implemented: BTreeSet<(String, String, String)> = Operation::ALL
        .iter()
        .map(|o| o.spec())
        .map(|s| (s.method.to_string(), s.path.to_string(), s.id.to_string()))
        .collect();
    assert_eq!(
        implemented.len(),
        Operation::ALL.len(),
        "two operations share a route"
    );
    let missing: Vec<_> = implemented.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&implemented).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/openapi.json and forkd::api::Operation differ\n  implemented, not documented: {missing:?}\n  documented, not implemented: {extra:?}"
    );
    let ids: BTreeSet<&str> = Operation::ALL.iter().map(|o| o.id()).collect();
    assert_eq!(
        ids.len(),
        Operation::ALL.len(),
        "operation ids must be unique"
    );
    for o in Operation::ALL {
        assert_eq!(Operation::from_id(o.id()), Some(o));
    }
}

#[test]
fn path_parameters_match_the_templates() {
    let doc = doc();
    for ((method, path, id), op) in operations(&doc) {
        let in_template: BTreeSet<String> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(String::from)
            .collect();
        let declared: BTreeSet<String> = params(&doc, &op)
            .into_iter()
            .filter(|(_, loc, _)| loc == "path")
            .map(|(name, _, req)| {
                assert!(
                    req,
                    "{method} {path}: path parameter {name} must be required"
                );
                name
            })
            .collect();
        assert_eq!(
            in_template, declared,
            "{id} ({method} {path}): path parameters of the template vs declared"
        );
    }
}

#[test]
fn every_error_response_is_an_api_error_with_its_kinds_status() {
    let doc = doc();
    let kinds = [
        ErrorKind::BadRequest,
        ErrorKind::NotFound,
        ErrorKind::Forbidden,
        ErrorKind::Conflict,
        ErrorKind::Internal,
    ];
    let serialised: Vec<Value> = kinds
        .iter()
        .map(|k| serde_json::to_value(k).unwrap())
        .collect();
    let (kind_schema, _) = resolve(&doc, &schema(&doc, "ApiError")["properties"]["kind"]);
    assert_eq!(
        kind_schema["enum"].as_array().unwrap(),
        &serialised,
        "ErrorKind enum"
    );
    let statuses: BTreeSet<String> = kinds
        .iter()
        .map(|k| ApiError::new(*k, "x").status().to_string())
        .collect();
    assert_eq!(
        statuses,
        ["400", "403", "404", "409", "500"].map(String::from).into()
    );
    for ((method, path, id), op) in operations(&doc) {
        let responses = op["responses"].as_object().unwrap();
        for must in ["400", "500"] {
            assert!(
                responses.contains_key(must),
                "{id} ({method} {path}) does not list {must}: any request can fail so"
            );
        }
        for (code, resp) in responses {
            if code.starts_with('4') || code.starts_with('5') {
                assert!(
                    statuses.contains(code),
                    "{id}: {code} is not a status of any ErrorKind"
                );
                let s = &follow(&doc, resp)["content"]["application/json"]["schema"];
                assert_eq!(
                    s["$ref"], "#/components/schemas/ApiError",
                    "{id}: {code} must be an ApiError"
                );
            }
            let rid = &follow(&doc, resp)["headers"]["X-Request-Id"];
            assert!(
                rid.is_object(),
                "{id}: {code} lacks the X-Request-Id header"
            );
        }
    }
    for k in kinds {
        let mut e = ApiError::new(k, "something failed");
        e.request_id = "r000001-abcd".into();
        check_serialised(&doc, "ApiError", &e);
        let back: ApiError = serde_json::from_value(serde_json::to_value(&e).unwrap()).unwrap();
        assert_eq!(back.status(), e.status());
    }
}

#[test]
fn request_and_response_bodies_reference_the_right_schemas() {
    let doc = doc();
    let ops = operations(&doc);
    let body = |id: &str| -> Option<String> {
        op(&ops, id).get("requestBody").map(|b| {
            let b = follow(&doc, b);
            let content = b["content"].as_object().unwrap();
            let (ctype, media) = content.iter().next().unwrap();
            format!(
                "{ctype} {}",
                media["schema"]["$ref"]
                    .as_str()
                    .map(|r| r.rsplit('/').next().unwrap().to_string())
                    .unwrap_or_else(|| media["schema"]["format"].as_str().unwrap_or("").into())
            )
        })
    };
    for o in Operation::ALL {
        let spec = o.spec();
        let want = match spec.body {
            RequestBody::None => None,
            RequestBody::Json(name) => Some(format!("application/json {name}")),
            RequestBody::Tar => Some("application/x-tar binary".to_string()),
        };
        assert_eq!(body(spec.id), want, "{}: request body", spec.id);
    }
    let ok = |id: &str, code: &str| -> String {
        let r = follow(&doc, &op(&ops, id)["responses"][code]);
        let content = r["content"]
            .as_object()
            .unwrap_or_else(|| panic!("{id}: {code} has no content"));
        let (ctype, media) = content.iter().next().unwrap();
        let s = &media["schema"];
        let name = match (s["$ref"].as_str(), s["type"].as_str()) {
            (Some(r), _) => r.rsplit('/').next().unwrap().to_string(),
            (None, Some("array")) => format!(
                "[{}]",
                s["items"]["$ref"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
            ),
            (None, _) => s["format"].as_str().unwrap_or("").to_string(),
        };
        format!("{ctype} {name}")
    };
    for o in Operation::ALL {
        let spec = o.spec();
        let want = match spec.answer {
            Answer::Json(name) => format!("application/json {name}"),
            Answer::Bytes(t) => format!("{t} binary"),
        };
        assert_eq!(
            ok(spec.id, &spec.status.to_string()),
            want,
            "{}: {} response",
            spec.id,
            spec.status
        );
    }
}

#[test]
fn exec_upgrade_is_documented() {
    let doc = doc();
    let ops = operations(&doc);
    let exec = op(&ops, "execInSandbox");
    let upgrade = exec["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| follow(&doc, p))
        .find(|p| p["in"] == "header" && p["name"] == "Upgrade")
        .expect("execInSandbox declares the Upgrade header");
    assert_eq!(upgrade["schema"]["enum"], json!([api::EXEC_UPGRADE]));
    let switching = &exec["responses"]["101"];
    assert_eq!(
        switching["headers"]["Upgrade"]["schema"]["enum"],
        json!([api::EXEC_UPGRADE])
    );
    let description = exec["description"].as_str().unwrap();
    for needle in [
        &format!("Upgrade: {}", api::EXEC_UPGRADE)[..],
        "4-byte big-endian",
        "16 MiB",
    ] {
        assert!(
            description.contains(needle),
            "execInSandbox's description does not mention {needle:?}"
        );
    }
    assert_eq!(
        forkd_sandbox::proto::MAX_FRAME,
        16 << 20,
        "the documented frame limit"
    );
    assert_eq!(
        forkd_sandbox::proto::HEADER,
        5,
        "the documented header size"
    );
    // Every kind, with its number and name, in the description.
    use forkd_sandbox::proto::Kind;
    for n in 0..=255u8 {
        if let Some(k) = Kind::from_u8(n) {
            let named = format!("{n} {k:?}");
            assert!(
                description.contains(&named),
                "execInSandbox's description lacks the frame kind {named:?}"
            );
            let mut buf = Vec::new();
            forkd_sandbox::proto::encode_frame(&mut buf, k, b"abc");
            assert_eq!(buf, [n, 0, 0, 0, 3, b'a', b'b', b'c'], "frame layout");
        }
    }
    assert!(Kind::from_u8(10).is_none() && Kind::from_u8(0).is_none());
}

fn sample_info(with_values: bool) -> SandboxInfo {
    SandboxInfo {
        id: "0123456789abcdef".into(),
        image: "alpine".into(),
        status: if with_values {
            SandboxStatus::Running
        } else {
            SandboxStatus::Stopped
        },
        created: 1_700_000_000,
        hostname: "0123456789ab".into(),
        init_pid: with_values.then_some(4242),
        limits: if with_values {
            Limits {
                memory_bytes: Some(256 << 20),
                pids: Some(128),
                cpu_millis: Some(500),
            }
        } else {
            Limits::default()
        },
        labels: if with_values {
            [("team".to_string(), "infra".to_string())].into()
        } else {
            BTreeMap::new()
        },
        rootfs: "/var/lib/forkd/sandboxes/0123456789abcdef/rootfs".into(),
        upper: "/var/lib/forkd/sandboxes/0123456789abcdef/layer/upper".into(),
        cgroup: "forkd/0123456789abcdef".into(),
        memory_bytes: with_values.then_some(1 << 20),
        oom_kills: Some(0),
        create_us: 12_345,
        network: with_values.then(|| api::NetworkInfo {
            mode: api::Network::allowlist(vec!["198.18.0.1".into(), "10.9.0.0/16".into()]),
            address: "10.213.0.6".into(),
            gateway: "10.213.0.5".into(),
            link: "fkd0123456789ab".into(),
            allowed: vec!["198.18.0.1/32".into(), "10.9.0.0/16".into()],
            nameservers: vec![],
            table: "forkd_0a1b2c3d".into(),
        }),
    }
}

/// A filesystem checkpoint of a fresh sandbox (hash pending), or a live checkpoint of a
/// branch (hash computed, with branches of its own).
fn sample_checkpoint(live: bool) -> CheckpointInfo {
    let phases: &[(&str, u64)] = if live {
        &[("dump", 84_210), ("snapshot", 912), ("total", 85_840)]
    } else {
        &[("freeze", 150), ("snapshot", 830), ("total", 1_210)]
    };
    CheckpointInfo {
        id: "89abcdef01234567".into(),
        parent: live.then(|| "76543210fedcba98".into()),
        sandbox: "0123456789abcdef".into(),
        image: "alpine:3.20".into(),
        live,
        created: 1_700_000_100,
        labels: if live {
            [("step".to_string(), "warm".to_string())].into()
        } else {
            BTreeMap::new()
        },
        layers: vec![
            "checkpoint:89abcdef01234567".into(),
            format!("layer:{}", "a".repeat(64)),
            format!("layer:{}", "b".repeat(64)),
        ],
        tree_hash: live.then(|| "c".repeat(64)),
        phases_us: phases.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        images_bytes: if live { 4 << 20 } else { 0 },
        branches: if live {
            vec!["a1b2c3d4e5f60718".into()]
        } else {
            Vec::new()
        },
    }
}

fn sample_branch(mode: ForkMode) -> BranchInfo {
    let phases: &[(&str, u64)] = if mode == ForkMode::Fresh {
        &[("prepare", 3_120), ("total", 24_800)]
    } else {
        &[
            ("prepare", 3_120),
            ("restore", 61_544),
            ("ready", 410),
            ("total", 65_202),
        ]
    };
    BranchInfo {
        id: "a1b2c3d4e5f60718".into(),
        mode,
        init_pid: Some(51_022),
        phases_us: phases.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[test]
fn response_types_serialise_to_their_schemas() {
    let doc = doc();
    check_serialised(&doc, "SandboxInfo", &sample_info(true));
    check_serialised(&doc, "SandboxInfo", &sample_info(false));
    for s in [
        SandboxStatus::Running,
        SandboxStatus::Stopping,
        SandboxStatus::Checkpointing,
        SandboxStatus::Removing,
        SandboxStatus::Stopped,
    ] {
        check_serialised(&doc, "SandboxStatus", &s);
    }
    check_serialised(
        &doc,
        "ImageInfo",
        &ImageInfo {
            name: "alpine:3.20".into(),
            layers: vec!["a".repeat(64), "b".repeat(64)],
            created: 1_700_000_000,
            source: "/srv/alpine.tar".into(),
            used_by: vec!["0123456789abcdef".into()],
            config: Default::default(),
        },
    );
    let built = ImageInfo {
        name: "task:env".into(),
        layers: vec!["a".repeat(64)],
        created: 1_700_000_000,
        source: "build:/srv/task/Dockerfile".into(),
        used_by: Vec::new(),
        config: ImageConfig {
            env: vec!["PATH=/bin".into()],
            cmd: vec!["sh".into()],
            entrypoint: vec!["/start.sh".into()],
            working_dir: Some("/app".into()),
            user: Some("app".into()),
            labels: [("k".to_string(), "v".to_string())].into(),
            exposed_ports: vec!["80/tcp".into()],
            shell: vec!["/bin/bash".into(), "-c".into()],
            stop_signal: Some("SIGINT".into()),
            volumes: vec!["/data".into()],
        },
    };
    check_serialised(&doc, "ImageInfo", &built);
    let steps = vec![
        BuildStep {
            stage: 0,
            line: 1,
            instruction: "FROM debian".into(),
            cache: "config".into(),
            layer: None,
            duration_us: 3,
        },
        BuildStep {
            stage: 0,
            line: 2,
            instruction: "RUN true".into(),
            cache: "miss".into(),
            layer: Some("b".repeat(64)),
            duration_us: 40_000,
        },
    ];
    for s in &steps {
        check_serialised(&doc, "BuildStep", s);
    }
    check_serialised(
        &doc,
        "BuildResult",
        &BuildResult {
            image: built,
            steps: steps.clone(),
            duration_us: 50_000,
        },
    );
    for current in [None, Some("RUN make".to_string())] {
        check_serialised(
            &doc,
            "BuildStatus",
            &BuildStatus {
                name: "task:env".into(),
                started: 1_700_000_000,
                steps: steps.clone(),
                current,
            },
        );
    }
    for (signal, code) in [(None, 3), (Some(9), 137)] {
        let exit = ExecExit {
            exit_code: code,
            signal,
            timed_out: signal.is_some(),
            duration_us: 1500,
        };
        check_serialised(&doc, "ExecExit", &exit);
        check_serialised(
            &doc,
            "ExecResult",
            &ExecResult {
                pid: 7,
                exit,
                stdout_b64: api::b64::encode(b"out\n"),
                stderr_b64: String::new(),
                output_b64: api::b64::encode(b"out\n"),
                output_bytes: 4,
                truncated: false,
            },
        );
    }
    check_serialised(
        &doc,
        "VersionInfo",
        &VersionInfo {
            version: "0.1.0".into(),
            api: api::API_VERSION.into(),
            root: "/var/lib/forkd".into(),
            cgroup_version: 2,
        },
    );
    let stats = OpStats {
        count: 10,
        errors: 1,
        p50_us: 100,
        p90_us: 200,
        p99_us: 300,
        max_us: 400,
    };
    check_serialised(&doc, "OpStats", &stats);
    let metrics: BTreeMap<String, OpStats> = [
        ("createSandbox".to_string(), stats.clone()),
        ("exec_stream".to_string(), OpStats::default()),
    ]
    .into();
    check_serialised(&doc, "Metrics", &metrics);
    check_serialised(
        &doc,
        "Limits",
        &Limits {
            memory_bytes: Some(1),
            pids: None,
            cpu_millis: Some(1000),
        },
    );
    for log_path in [None, Some("/.forkd/logs/main.log".to_string())] {
        check_serialised(&doc, "ExecStarted", &ExecStarted { pid: 1, log_path });
    }
    check_serialised(
        &doc,
        "ExecErrorFrame",
        &json!({ "message": "ls: command not found" }),
    );
    for live in [false, true] {
        check_serialised(&doc, "CheckpointInfo", &sample_checkpoint(live));
    }
    let mut branches = Vec::new();
    for mode in ForkMode::ALL {
        let b = sample_branch(mode);
        check_serialised(&doc, "BranchInfo", &b);
        branches.push(b);
    }
    let mut no_pid = sample_branch(ForkMode::Eager);
    no_pid.init_pid = None;
    check_serialised(&doc, "BranchInfo", &no_pid);
    check_serialised(
        &doc,
        "ForkResult",
        &ForkResult {
            checkpoint: "89abcdef01234567".into(),
            branches,
        },
    );
    check_serialised(
        &doc,
        "ForkResult",
        &ForkResult {
            checkpoint: "89abcdef01234567".into(),
            branches: Vec::new(),
        },
    );
    let refusal = Refusal {
        t_us: 1_718_000_012_345_678,
        method: "POST".into(),
        path: "/v1/checkpoints/89abcdef01234567/fork".into(),
        reason: "grant 0c1d2e3f40516273 allows exec, files, logs and inspect of sandbox 0123456789abcdef only, not forkCheckpoint".into(),
        budget: false,
    };
    for (max_steps, refusals) in [(Some(4), vec![refusal]), (None, Vec::new())] {
        check_serialised(
            &doc,
            "GrantInfo",
            &GrantInfo {
                id: "0c1d2e3f40516273".into(),
                sandbox: "0123456789abcdef".into(),
                socket: "/run/forkd/forkd.sock.grants/0c1d2e3f40516273.sock".into(),
                uid: 2_000_000_001,
                gid: 2_000_000_001,
                max_steps,
                steps: 3,
                refused: refusals.len() as u64,
                refusals,
                active: true,
            },
        );
    }
    for name in ["RemovedImage", "RemovedSandbox", "RemovedCheckpoint"] {
        check_serialised(&doc, name, &json!({ "removed": "x" }));
    }
}

#[test]
fn request_schemas_deserialise_into_the_request_types() {
    let doc = doc();
    check_request::<CreateSandboxRequest>(&doc, "CreateSandboxRequest");
    check_request::<BuildRequest>(&doc, "BuildRequest");
    check_request::<ExecBody>(&doc, "ExecBody");
    check_request::<ExecRequest>(&doc, "ExecRequest");
    check_request::<ImportImageRequest>(&doc, "ImportImageRequest");
    check_request::<StopRequest>(&doc, "StopRequest");
    check_request::<Limits>(&doc, "Limits");
    check_request::<CheckpointRequest>(&doc, "CheckpointRequest");
    check_request::<ForkRequest>(&doc, "ForkRequest");
    check_request::<ArchivePath>(&doc, "ArchivePath");
    check_request::<ExportRequest>(&doc, "ExportRequest");
    check_request::<GrantRequest>(&doc, "GrantRequest");
    let g: GrantRequest = serde_json::from_value(json!({ "uid": 5 })).unwrap();
    assert!(g.gid.is_none() && g.max_steps.is_none());

    // ExecBody is ExecRequest's fields plus stdin_b64, flattened.
    let body = names(schema(&doc, "ExecBody").get("properties"));
    let mut req = names(schema(&doc, "ExecRequest").get("properties"));
    req.insert("stdin_b64".into());
    req.insert("output_limit".into());
    assert_eq!(
        body, req,
        "ExecBody = ExecRequest + stdin_b64 + output_limit"
    );
    let parsed: ExecBody = serde_json::from_value(json!({
        "argv": ["cat"], "stdin_b64": "aGk=", "timeout_ms": 5
    }))
    .unwrap();
    assert_eq!(parsed.request.argv, ["cat"]);
    assert_eq!(parsed.request.timeout_ms, Some(5));
    assert_eq!(parsed.stdin_b64.as_deref(), Some("aGk="));
    // The upgraded exec takes a plain ExecRequest: stdin_b64 is refused there.
    assert!(
        serde_json::from_value::<ExecRequest>(json!({"argv": ["cat"], "stdin_b64": "aGk="}))
            .is_err()
    );
    // Unknown properties are refused inside a create request's command too.
    assert!(serde_json::from_value::<CreateSandboxRequest>(json!({
        "image": "alpine", "command": {"argv": ["true"], "bogus": 1}
    }))
    .is_err());
    // Nullable properties accept null.
    let c: CreateSandboxRequest = serde_json::from_value(json!({
        "image": "alpine", "command": null, "hostname": null,
        "limits": {"memory_bytes": null, "pids": 5}
    }))
    .unwrap();
    assert_eq!(c.limits.pids, Some(5));
    // Every property of ExecRequest and StopRequest is optional: {} is a valid body.
    serde_json::from_value::<ExecBody>(json!({})).unwrap();
    serde_json::from_value::<StopRequest>(json!({})).unwrap();
    // The same for checkpoints and forks, with the documented defaults.
    let c: CheckpointRequest = serde_json::from_value(json!({})).unwrap();
    assert!(!c.live && !c.stop && c.labels.is_empty());
    let f: ForkRequest = serde_json::from_value(json!({ "count": null })).unwrap();
    assert!(f.count.is_none() && !f.lazy && f.labels.is_empty());
    let count = &schema(&doc, "ForkRequest")["properties"]["count"];
    assert_eq!(count["default"], json!(1), "the default branch count");
    assert_eq!(count["minimum"], json!(1));
    assert_eq!(count["maximum"], json!(10_000));
    // A count below zero is not a usize.
    assert!(serde_json::from_value::<ForkRequest>(json!({ "count": -1 })).is_err());
}

#[test]
fn answers_and_records_are_their_schemas() {
    let doc = doc();
    // Built from each schema, read into the type and written back unchanged: the type's
    // fields are the schema's properties, none missing, none extra.
    check_request::<ExportResult>(&doc, "ExportResult");
    check_request::<GcResult>(&doc, "GcResult");
    check_request::<CopyResult>(&doc, "CopyResult");
    check_request::<ExecRecord>(&doc, "ExecRecord");
    for name in ["RemovedImage", "RemovedSandbox", "RemovedCheckpoint"] {
        check_request::<Removed>(&doc, name);
    }
    check_serialised(
        &doc,
        "ExportResult",
        &ExportResult {
            path: "/srv/checkpoints/warm.forkd".into(),
            bytes: 31_457_280,
            files: 9,
            tree_hash: "c".repeat(64),
            duration_us: 812_345,
        },
    );
    check_serialised(
        &doc,
        "GcResult",
        &GcResult {
            removed_layers: vec!["a".repeat(64)],
            freed_bytes: 7_340_032,
        },
    );
    let exit = serde_json::to_value(ExecExit {
        exit_code: 3,
        signal: None,
        timed_out: false,
        duration_us: 2210,
    })
    .unwrap();
    let detached = serde_json::to_value(DetachedExec {
        pid: 14,
        log: Some("/.forkd/logs/job1.log".into()),
    })
    .unwrap();
    for (argv, shell, result) in [
        (
            Some(vec!["sh".to_string(), "-c".into(), "exit 3".into()]),
            None,
            exit,
        ),
        (None, Some("sleep 5".to_string()), detached),
        (
            Some(vec!["nope".to_string()]),
            None,
            json!({ "message": "not found" }),
        ),
        (Some(vec!["sh".to_string()]), None, Value::Null),
    ] {
        check_serialised(
            &doc,
            "ExecRecord",
            &ExecRecord {
                t_us: 1_718_000_012_345_678,
                argv,
                shell,
                cwd: None,
                user: Some("1000:1000".into()),
                tty: false,
                detach: false,
                result,
            },
        );
    }
}

#[test]
fn checkpoint_modes_and_phases_are_documented() {
    let doc = doc();
    // The modes a fork reports are exactly BranchInfo.mode's enum.
    let modes: BTreeSet<String> = ForkMode::ALL
        .iter()
        .map(|m| {
            let v = serde_json::to_value(m).unwrap();
            assert_eq!(v, json!(m.as_str()));
            m.as_str().to_string()
        })
        .collect();
    let documented: BTreeSet<String> = schema(&doc, "BranchInfo")["properties"]["mode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(modes, documented, "BranchInfo.mode: the fork's modes");

    // Every phase the daemon can record is named in the description of its phases_us.
    for (schema_name, phases) in [
        ("CheckpointInfo", api::CHECKPOINT_PHASES),
        ("BranchInfo", api::FORK_PHASES),
    ] {
        assert!(phases.contains(&"total"), "{schema_name}: no total");
        let description = schema(&doc, schema_name)["properties"]["phases_us"]["description"]
            .as_str()
            .unwrap();
        for p in phases {
            assert!(
                description.contains(&format!("`{p}`")),
                "{schema_name}.phases_us does not document the phase {p:?}"
            );
        }
    }
}

#[test]
fn operation_specs_answer_as_documented() {
    let doc = doc();
    let ops = operations(&doc);
    for o in Operation::ALL {
        let spec = o.spec();
        let id = spec.id;
        let op = op(&ops, id);
        let responses = op["responses"].as_object().unwrap();
        let documented: BTreeSet<String> = responses
            .keys()
            .filter(|c| c.starts_with('2'))
            .cloned()
            .collect();
        assert_eq!(
            documented,
            BTreeSet::from([spec.status.to_string()]),
            "{id}: documented success statuses vs the spec's"
        );
        if o == Operation::ExecInSandbox {
            assert!(
                responses.contains_key("101"),
                "the exec upgrade answers 101"
            );
        } else {
            assert!(!responses.contains_key("101"), "{id} does not upgrade");
        }
        let query: BTreeSet<(String, bool)> = params(&doc, op)
            .into_iter()
            .filter(|(_, loc, _)| loc == "query")
            .map(|(n, _, r)| (n, r))
            .collect();
        let declared: BTreeSet<(String, bool)> = spec
            .query
            .iter()
            .map(|(n, r)| (n.to_string(), *r))
            .collect();
        assert_eq!(
            query, declared,
            "{id}: documented query parameters (name, required) vs the spec's"
        );
    }
}
