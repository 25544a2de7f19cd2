//! OpenAI's strict mode accepts only a subset of JSON Schema: this module adapts a tool's or an
//! output's schema to it, so that a model builder's `strict(true)` works with ordinary schemas.

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
