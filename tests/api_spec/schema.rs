//! Reading `docs/openapi.json`: references followed, schemas and parameters looked up,
//! a value checked against a schema, a sample built from one.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub(crate) const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

pub(crate) fn doc() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Follows `$ref`s (local ones only).
pub(crate) fn follow<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
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
pub(crate) fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> (&'a Value, bool) {
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

pub(crate) fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc.pointer(&format!("/components/schemas/{name}"))
        .unwrap_or_else(|| panic!("components.schemas.{name} is missing"))
}

pub(crate) fn names(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

pub(crate) fn required(s: &Value) -> BTreeSet<String> {
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
pub(crate) fn check_value(
    doc: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
    errs: &mut Vec<String>,
) {
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
pub(crate) fn check_serialised<T: Serialize>(doc: &Value, name: &str, value: &T) {
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
pub(crate) fn sample(doc: &Value, schema: &Value) -> Value {
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
pub(crate) fn check_request<T: Serialize + DeserializeOwned>(doc: &Value, name: &str) {
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
pub(crate) fn operations(doc: &Value) -> BTreeMap<(String, String, String), Value> {
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

pub(crate) fn op<'a>(ops: &'a BTreeMap<(String, String, String), Value>, id: &str) -> &'a Value {
    ops.iter()
        .find(|((_, _, i), _)| i == id)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("operation {id} is not in the document"))
}

/// (name, location, required) of an operation's parameters.
pub(crate) fn params(doc: &Value, op: &Value) -> BTreeSet<(String, String, bool)> {
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
