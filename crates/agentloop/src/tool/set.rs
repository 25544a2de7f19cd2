//! The tools of an agent ([`ToolSet`]): names checked and schemas compiled once, at registration,
//! so that validating a call is a lookup and a schema walk; a declared output schema checks what a
//! call hands back.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use jsonschema::json::Json;

use super::args::{self, ArgsJson, Arguments};
use super::layer::{self, Layered};
use super::{Tool, ToolDefinitionError, ToolPolicy, ToolSpec};
use crate::message::ToolContent;
use crate::outcome::CallArguments;

/// Checks the naming rule: a letter first, then letters, digits, `_` or `-`; 1 to 128 characters.
pub fn check_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > 128 {
        return Err(format!(
            "the name is {} characters long; at most 128 are allowed",
            name.chars().count()
        ));
    }
    let mut chars = name.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic()) {
        return Err("the name must start with a letter".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "the name holds {bad:?}; only letters, digits, '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// A registered tool's handler, under the layers its policy asks for.
#[derive(Clone)]
pub(crate) struct RegisteredTool {
    /// The handler under the layers its policy asks for, composed once here.
    pub(crate) call: Layered,
    /// The policy the layers apply, for those who show it.
    pub(crate) policy: ToolPolicy,
}

/// One spec's compiled parts.
#[derive(Clone)]
struct Compiled {
    /// The input schema, checked on the arguments' text as read ([`super::args`]).
    validator: Arc<jsonschema::Validator<ArgsJson>>,
    /// The declared output schema, compiled.
    output: Option<Arc<jsonschema::Validator>>,
}

/// The specs of a set of tools, names checked and schemas compiled, without their handlers:
/// what the machine validates calls against. A run whose tools change (a [`super::ToolSource`])
/// gets a new catalog from the new specs alone, so a replay needs no handler to rebuild it.
#[derive(Default, Clone)]
pub struct ToolCatalog {
    specs: Vec<ToolSpec>,
    compiled: Vec<Compiled>,
    by_name: HashMap<String, usize, foldhash::fast::RandomState>,
}

impl fmt::Debug for ToolCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.specs.iter().map(|s| &s.name))
            .finish()
    }
}

impl ToolCatalog {
    /// Checks a spec (its name, its uniqueness and its schemas), compiles its schemas and adds
    /// it.
    pub(crate) fn add(&mut self, mut spec: ToolSpec) -> Result<(), ToolDefinitionError> {
        let registered = || -> Vec<String> { self.specs.iter().map(|s| s.name.clone()).collect() };
        if let Err(reason) = check_tool_name(&spec.name) {
            return Err(ToolDefinitionError::InvalidName {
                name: spec.name,
                reason,
                registered: registered(),
            });
        }
        if self.by_name.contains_key(&spec.name) {
            return Err(ToolDefinitionError::Duplicate {
                name: spec.name,
                registered: registered(),
            });
        }
        let schema_err = |spec: &ToolSpec, reason: String| ToolDefinitionError::InvalidSchema {
            name: spec.name.clone(),
            reason,
            registered: registered(),
        };
        if spec.input_schema.is_null() {
            spec.input_schema = serde_json::json!({"type": "object", "properties": {}});
        }
        match &spec.input_schema {
            Value::Object(map) => match map.get("type") {
                None => {}
                Some(Value::String(t)) if t == "object" => {}
                Some(other) => {
                    return Err(schema_err(
                        &spec,
                        format!("the input schema must describe an object, not {other}"),
                    ));
                }
            },
            other => {
                return Err(schema_err(
                    &spec,
                    format!("the input schema must be a JSON object, not {other}"),
                ));
            }
        }
        let validator =
            compile_arguments_schema(&spec.input_schema).map_err(|e| schema_err(&spec, e))?;
        let output = match &spec.output_schema {
            Some(output) => {
                Some(Arc::new(compile_schema(output).map_err(|e| {
                    schema_err(&spec, format!("output schema: {e}"))
                })?))
            }
            None => None,
        };
        self.by_name.insert(spec.name.clone(), self.specs.len());
        self.compiled.push(Compiled {
            validator: Arc::new(validator),
            output,
        });
        self.specs.push(spec);
        Ok(())
    }

    /// The first `n` tools of this catalog.
    pub(crate) fn prefix(&self, n: usize) -> ToolCatalog {
        let n = n.min(self.specs.len());
        ToolCatalog {
            specs: self.specs.get(..n).unwrap_or_default().to_vec(),
            compiled: self.compiled.get(..n).unwrap_or_default().to_vec(),
            by_name: self
                .by_name
                .iter()
                .filter(|(_, i)| **i < n)
                .map(|(k, i)| (k.clone(), *i))
                .collect(),
        }
    }

    /// The specs, in registration order.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The index of a tool by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The spec at an index.
    pub fn spec(&self, index: usize) -> Option<&ToolSpec> {
        self.specs.get(index)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// True when there are no tools.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The names, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.specs.iter().map(|s| s.name.as_str())
    }

    /// Validates arguments against a tool's compiled schema: every failing path with its reason.
    pub fn validate(&self, index: usize, args: &Value) -> Result<(), Vec<SchemaViolation>> {
        // The schema is checked on text as read. A `Value` always serializes; were that to fail,
        // the arguments fail rather than pass as blank text would (`{}`).
        let text = serde_json::to_string(args).map_err(|e| {
            vec![SchemaViolation {
                path: String::new(),
                reason: format!("cannot be written as JSON ({e})"),
            }]
        })?;
        match self.check_arguments(index, &text) {
            Ok(_) => Ok(()),
            Err(Rejected::Invalid { violations, .. }) => Err(violations),
            Err(Rejected::NotJson(e)) => Err(vec![SchemaViolation {
                path: String::new(),
                reason: format!("not valid JSON ({e})"),
            }]),
        }
    }

    /// Reads a call's arguments (`raw` as the model sent it; blank or `null` is `{}`) and checks them
    /// against the tool's schema. No `Value` is made unless they fail it.
    pub(crate) fn check_arguments(&self, index: usize, raw: &str) -> Result<Arguments, Rejected> {
        self.check_with(index, raw, |root| {
            Arguments::from_text(CallArguments::of(&root))
        })
    }

    /// [`ToolCatalog::check_arguments`], the text of valid arguments appended to a batch's
    /// buffer ([`CallArguments::append`]): the span it takes there.
    pub(crate) fn check_arguments_into(
        &self,
        index: usize,
        raw: &str,
        buf: &mut Vec<u8>,
    ) -> Result<Option<std::ops::Range<usize>>, Rejected> {
        self.check_with(index, raw, |root| CallArguments::append(buf, &root))
    }

    /// Reads and checks a call's arguments, then `keep`s them when they are valid.
    fn check_with<T>(
        &self,
        index: usize,
        raw: &str,
        keep: impl FnOnce(args::ArgNode<'_>) -> T,
    ) -> Result<T, Rejected> {
        let Some(compiled) = self.compiled.get(index) else {
            return Err(Rejected::Invalid {
                violations: vec![SchemaViolation {
                    path: String::new(),
                    reason: "no such tool".into(),
                }],
                value: Value::Null,
            });
        };
        // `null` for no arguments (Cohere's compatible API and some local servers send it for a
        // tool without parameters): a tool's object schema never takes null, so it reads as none
        // (`{}`), as an empty text does, rather than failing every call of the tool.
        let raw = if raw.trim() == "null" { "" } else { raw };
        args::with_parsed(raw, |root| {
            let root = root.map_err(Rejected::NotJson)?;
            match validate_with(&compiled.validator, root) {
                Ok(()) => Ok(keep(root)),
                Err(violations) => Err(Rejected::Invalid {
                    violations,
                    value: root.value(),
                }),
            }
        })
    }

    /// Checks a successful output against the tool's declared output schema, if it has one: a
    /// JSON output as it is, a text output parsed as JSON.
    pub(crate) fn check_output(&self, index: usize, content: &ToolContent) -> Result<(), String> {
        let Some(validator) = self.compiled.get(index).and_then(|c| c.output.as_ref()) else {
            return Ok(());
        };
        let parsed;
        let value = match content {
            ToolContent::Json(v) => v,
            ToolContent::Text(t) => {
                parsed = serde_json::from_str::<Value>(t)
                    .map_err(|e| format!("the output is not JSON ({e})"))?;
                &parsed
            }
            ToolContent::Parts(_) => {
                return Err("the output is not JSON (it has several parts)".into());
            }
        };
        validate_with(validator, value).map_err(|v| join_violations(&v))
    }
}

/// The tools of an agent, checked and compiled: their [`ToolCatalog`] (which a model request
/// borrows without copying) and their handlers.
#[derive(Default, Clone)]
pub struct ToolSet {
    catalog: Arc<ToolCatalog>,
    entries: Vec<RegisteredTool>,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.catalog.fmt(f)
    }
}

impl std::ops::Deref for ToolSet {
    type Target = ToolCatalog;

    fn deref(&self) -> &ToolCatalog {
        &self.catalog
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool: checks its name, its uniqueness and its schemas, and compiles the input
    /// schema.
    pub fn register(&mut self, tool: Tool) -> Result<(), ToolDefinitionError> {
        let Tool {
            spec,
            handler,
            policy,
        } = tool;
        Arc::make_mut(&mut self.catalog).add(spec)?;
        let call = layer::compose(handler, &policy);
        self.entries.push(RegisteredTool { call, policy });
        Ok(())
    }

    /// The specs, checked and compiled.
    pub fn catalog(&self) -> &Arc<ToolCatalog> {
        &self.catalog
    }

    /// The policy of the tool at an index.
    pub fn policy(&self, index: usize) -> Option<&ToolPolicy> {
        self.entries.get(index).map(|e| &e.policy)
    }

    pub(crate) fn entry(&self, index: usize) -> Option<&RegisteredTool> {
        self.entries.get(index)
    }
}

/// One way a value failed its schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaViolation {
    /// The JSON Pointer of the failing value (empty for the root).
    pub path: String,
    /// Why it failed.
    pub reason: String,
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.reason)
    }
}

/// Checks that a JSON Schema compiles as a tool's or an answer's schema would (2020-12 unless it
/// says otherwise; external references refused): for tools that check a schema before any agent
/// is built, such as an agent-file checker.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    compile_schema(schema).map(drop)
}

/// Compiles a JSON Schema. External references are refused: a schema never makes the program
/// fetch anything. The validator is the crate's own business, never part of its public face.
pub(crate) fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Compiles a tool's input schema, for checking arguments as read ([`super::args`]).
fn compile_arguments_schema(schema: &Value) -> Result<jsonschema::Validator<ArgsJson>, String> {
    jsonschema::options_for::<ArgsJson>()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Why a call's arguments were not admitted ([`ToolCatalog::check_arguments`]).
#[derive(Debug)]
pub(crate) enum Rejected {
    /// The text is not JSON.
    NotJson(serde_json::Error),
    /// They fail the schema: every failing path, and the arguments as read.
    Invalid {
        violations: Vec<SchemaViolation>,
        value: Value,
    },
}

/// Violations joined for the model to read.
pub(crate) fn join_violations(v: &[SchemaViolation]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

pub(crate) fn validate_with<'v, F: Json>(
    validator: &'v jsonschema::Validator<F>,
    value: F::Node<'v>,
) -> Result<(), Vec<SchemaViolation>> {
    if validator.is_valid(value.clone()) {
        return Ok(());
    }
    let violations: Vec<SchemaViolation> = validator
        .iter_errors(value)
        .map(|e| SchemaViolation {
            path: e.instance_path().to_string(),
            reason: e.to_string(),
        })
        .collect();
    if violations.is_empty() {
        return Err(vec![SchemaViolation {
            path: String::new(),
            reason: "does not match the schema".into(),
        }]);
    }
    Err(violations)
}
