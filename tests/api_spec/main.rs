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
//!
//! This file: the operations (ids, paths, statuses, bodies, errors, specs); `schema.rs`:
//! reading the document (references, schemas, parameters) and checking a value against
//! a schema; `bodies.rs`: the request and response types against their schemas.

#![forbid(unsafe_code)]

mod bodies;
mod schema;

use forkd::api::{self, Answer, ApiError, ErrorKind, ForkMode, Operation, RequestBody};
use serde_json::{json, Value};
use std::collections::BTreeSet;

use schema::*;

#[test]
fn document_is_openapi_3_0_3_for_this_api_version() {
    let doc = doc();
    assert_eq!(doc["openapi"], "3.0.3");
    assert_eq!(doc["info"]["version"], api::API_VERSION);
    for path in doc["paths"].as_object().unwrap().keys() {
        // Prometheus's scrapers look at /metrics.
        assert!(
            path == "/metrics" || path.starts_with(&format!("/{}/", api::API_VERSION)),
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
        ErrorKind::Unauthorized,
        ErrorKind::Forbidden,
        ErrorKind::Conflict,
        ErrorKind::Internal,
        ErrorKind::Unavailable,
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
        ["400", "401", "403", "404", "409", "500", "503"]
            .map(String::from)
            .into()
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
            RequestBody::Bytes => Some("application/octet-stream binary".to_string()),
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
    assert!(Kind::from_u8(11).is_none() && Kind::from_u8(0).is_none());
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
