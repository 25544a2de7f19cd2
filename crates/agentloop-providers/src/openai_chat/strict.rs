//! OpenAI's strict mode accepts only a subset of JSON Schema: this module adapts a tool's or an
//! output's schema to it, so that a model builder's `strict(true)` works with ordinary schemas,
//! and reads the model's answers back in the original schema's terms: strict mode makes the model
//! write `null` for every optional property it leaves out ([`drop_strict_nulls`]).

use serde_json::{Map, Value};

/// The `format` values strict mode accepts; others are dropped from strict schemas.
const STRICT_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// Adapts a JSON Schema to what OpenAI's strict mode accepts: every object lists all its
/// properties as required, the ones that were optional become nullable, `additionalProperties`
/// is `false`, and unsupported `format`s are dropped; recursively, through properties, items,
/// combinators and definitions.
pub fn strict_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    make_strict(&mut schema);
    schema
}

fn make_strict(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    if let Some(Value::String(format)) = map.get("format")
        && !STRICT_FORMATS.contains(&format.as_str())
    {
        map.remove("format");
    }
    let is_object = map.get("properties").is_some()
        || match map.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => false,
        };
    if is_object {
        let required: Vec<String> = match map.get("required") {
            Some(Value::Array(r)) => r
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let mut all = Vec::new();
        if let Some(Value::Object(props)) = map.get_mut("properties") {
            for (name, prop) in props.iter_mut() {
                make_strict(prop);
                if !required.contains(name) {
                    make_nullable(prop);
                }
                all.push(Value::String(name.clone()));
            }
        }
        map.insert("required".to_owned(), Value::Array(all));
        map.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    for key in ["items", "additionalItems", "not"] {
        if let Some(sub) = map.get_mut(key) {
            make_strict(sub);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(make_strict);
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = map.get_mut(key) {
            defs.values_mut().for_each(make_strict);
        }
    }
}

/// How deep [`drop_strict_nulls`] follows a value and its schema (`$ref`s included), so that no
/// schema that refers to itself can make it recurse without end.
const MAX_DEPTH: usize = 64;

/// Takes out of `value` (a call's arguments, a structured answer) the nulls that strict mode made
/// the model write: a property the original `schema` does not require, whose value is `null`
/// where the property's own schema does not accept `null`, is removed, as if the model had left
/// it out, which is what the null stands for. Recursively, through properties, items,
/// combinators and `$ref`s into the schema's `$defs`. A null the original schema accepts is the
/// model's own and stays. True when anything was removed.
pub(crate) fn drop_strict_nulls(value: &mut Value, schema: &Value) -> bool {
    drop_in(value, schema, schema, 0)
}

fn drop_in(value: &mut Value, schema: &Value, root: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let Some(Value::Object(s)) = resolve(schema, root, depth) else {
        return false;
    };
    let mut changed = false;
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = s.get("properties") {
                let required = |key: &str| {
                    s.get("required")
                        .and_then(Value::as_array)
                        .is_some_and(|r| r.iter().any(|k| k == key))
                };
                let before = map.len();
                map.retain(|key, v| {
                    !(v.is_null()
                        && !required(key)
                        && props
                            .get(key)
                            .is_some_and(|p| !accepts_null(p, root, depth + 1)))
                });
                changed |= map.len() != before;
                for (key, v) in map.iter_mut() {
                    if let Some(p) = props.get(key) {
                        changed |= drop_in(v, p, root, depth + 1);
                    }
                }
            }
        }
        Value::Array(items) => {
            let prefix = s.get("prefixItems").and_then(Value::as_array);
            let rest = s.get("items").filter(|i| i.is_object());
            for (i, item) in items.iter_mut().enumerate() {
                if let Some(p) = prefix.and_then(|p| p.get(i)).or(rest) {
                    changed |= drop_in(item, p, root, depth + 1);
                }
            }
        }
        _ => {}
    }
    if let Some(Value::Array(all)) = s.get("allOf") {
        for branch in all {
            changed |= drop_in(value, branch, root, depth + 1);
        }
    }
    // Of the alternatives, the one the value is shaped for (strict mode closed every object, so
    // an object's branch names all its keys).
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = s.get(key)
            && let Some(branch) = branches
                .iter()
                .find(|b| shaped_for(value, b, root, depth + 1))
        {
            changed |= drop_in(value, branch, root, depth + 1);
        }
    }
    changed
}

/// The schema `schema` stands for: itself, or what its local `$ref` (`#/...`) points at.
fn resolve<'a>(schema: &'a Value, root: &'a Value, depth: usize) -> Option<&'a Value> {
    let mut schema = schema;
    for _ in depth..MAX_DEPTH {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => schema = root.pointer(reference.strip_prefix('#')?)?,
            None => return Some(schema),
        }
    }
    None
}

/// Whether `schema` describes values shaped like `value`: an object whose properties name all its
/// keys, or an array.
fn shaped_for(value: &Value, schema: &Value, root: &Value, depth: usize) -> bool {
    let Some(Value::Object(s)) = resolve(schema, root, depth) else {
        return false;
    };
    match value {
        Value::Object(map) => s
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|props| map.keys().all(|k| props.contains_key(k))),
        Value::Array(_) => s.contains_key("items") || s.contains_key("prefixItems"),
        _ => false,
    }
}

/// Whether `schema` accepts `null`, as JSON Schema reads it: a schema that says nothing of the
/// type accepts it. Unsure (a `$ref` that goes nowhere, too deep), it does: the null stays, and
/// the run's check of the arguments decides.
fn accepts_null(schema: &Value, root: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    let Some(schema) = resolve(schema, root, depth) else {
        return true;
    };
    let map = match schema {
        Value::Object(map) => map,
        Value::Bool(accepts) => return *accepts,
        _ => return true,
    };
    let null = Value::Null;
    let checks = [
        map.get("type").map(|t| match t {
            Value::String(t) => t == "null",
            Value::Array(ts) => ts.iter().any(|t| t == "null"),
            _ => true,
        }),
        map.get("enum")
            .and_then(Value::as_array)
            .map(|values| values.contains(&null)),
        map.get("const").map(Value::is_null),
        map.get("anyOf")
            .and_then(Value::as_array)
            .map(|bs| bs.iter().any(|b| accepts_null(b, root, depth + 1))),
        map.get("oneOf")
            .and_then(Value::as_array)
            .map(|bs| bs.iter().any(|b| accepts_null(b, root, depth + 1))),
        map.get("allOf")
            .and_then(Value::as_array)
            .map(|bs| bs.iter().all(|b| accepts_null(b, root, depth + 1))),
    ];
    checks.into_iter().flatten().all(|accepts| accepts)
}

fn make_nullable(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    let null = Value::from("null");
    match map.get_mut("type") {
        Some(Value::String(t)) => {
            if t != "null" {
                let t = std::mem::take(t);
                map.insert(
                    "type".to_owned(),
                    Value::Array(vec![Value::String(t), null.clone()]),
                );
            }
        }
        Some(Value::Array(types)) => {
            if !types.contains(&null) {
                types.push(null.clone());
            }
        }
        _ => {
            let inner = std::mem::replace(map, Map::new());
            map.insert(
                "anyOf".to_owned(),
                Value::Array(vec![
                    Value::Object(inner),
                    serde_json::json!({"type": "null"}),
                ]),
            );
            return;
        }
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn the_nulls_strict_mode_added_are_taken_out_and_the_models_own_stay() {
        let schema = json!({
            "type": "object",
            "properties": {
                "q": {"type": "string"},
                "limit": {"type": "integer"},
                "note": {"type": ["string", "null"]},
                "any": {"description": "anything"},
                "mode": {"enum": ["a", "b"]},
                "thing": {"$ref": "#/$defs/Thing"},
                "items": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "number"}}, "required": ["k"]}},
                "either": {"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}}}, {"type": "string"}]}
            },
            "required": ["q"],
            "$defs": {"Thing": {"type": "object", "properties": {"y": {"type": "boolean"}}}}
        });
        let mut args = json!({
            "q": "x", "limit": null, "note": null, "any": null, "mode": null,
            "thing": {"y": null},
            "items": [{"k": "a", "v": null}, {"k": "b", "v": 1}],
            "either": {"x": null}
        });
        assert!(drop_strict_nulls(&mut args, &schema));
        assert_eq!(
            args,
            json!({
                "q": "x", "note": null, "any": null,
                "thing": {},
                "items": [{"k": "a"}, {"k": "b", "v": 1}],
                "either": {}
            })
        );
        // A required property's null is the model's mistake, for the run's check to report.
        let mut args = json!({"q": null});
        assert!(!drop_strict_nulls(&mut args, &schema));
        assert_eq!(args, json!({"q": null}));
        // A `$ref` to itself ends.
        let looping = json!({"$ref": "#"});
        let mut args = json!({"a": null});
        assert!(!drop_strict_nulls(&mut args, &looping));
    }

    #[test]
    fn strict_schema_requires_every_property_and_makes_optional_ones_nullable() {
        let schema = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "limit": {"type": "integer", "format": "uint32"},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "nested": {"type": "object", "properties": {"x": {"type": "number"}}},
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}},
                "any": {"$ref": "#/$defs/Thing"}
            },
            "required": ["path", "tags"],
            "$defs": {"Thing": {"type": "object", "properties": {"y": {"type": "boolean"}}}}
        });
        let strict = strict_schema(&schema);
        assert_eq!(
            strict["required"],
            json!(["any", "limit", "mode", "nested", "path", "tags"])
        );
        assert_eq!(strict["additionalProperties"], json!(false));
        assert_eq!(strict["properties"]["path"]["type"], json!("string"));
        assert_eq!(
            strict["properties"]["limit"],
            json!({"type": ["integer", "null"]})
        );
        assert_eq!(
            strict["properties"]["mode"]["enum"],
            json!(["a", "b", null])
        );
        assert_eq!(
            strict["properties"]["nested"]["type"],
            json!(["object", "null"])
        );
        assert_eq!(strict["properties"]["nested"]["required"], json!(["x"]));
        assert_eq!(
            strict["properties"]["nested"]["properties"]["x"]["type"],
            json!(["number", "null"])
        );
        assert_eq!(
            strict["properties"]["tags"]["items"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(
            strict["properties"]["tags"]["items"]["properties"]["k"]["type"],
            json!("string")
        );
        assert_eq!(
            strict["properties"]["any"],
            json!({"anyOf": [{"$ref": "#/$defs/Thing"}, {"type": "null"}]})
        );
        assert_eq!(
            strict["$defs"]["Thing"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(strict["$defs"]["Thing"]["required"], json!(["y"]));
    }
}
