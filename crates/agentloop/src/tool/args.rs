//! A call's arguments between the model's text and the tool.
//!
//! The text a model sends is read once into a flat view of it ([`Tape`], kept per thread and
//! reused, so reading allocates nothing once it has grown), the tool's schema is checked on that
//! view (`jsonschema` validates any representation through its `Json` traits), and the view writes
//! the compact text the record keeps. The result is an [`Arguments`]: that text, and the
//! `serde_json::Value` made only the first time something reads one (a gate, a hook, a handler
//! over a `Value`). A typed handler deserializes its type from the text, so a call of one builds
//! no tree at all: the tree was five of a call's sixteen allocations, and a run's calls' trees
//! most of its memory while they ran (BENCHMARKS.md, #30).
//!
//! The view reads exactly what `serde_json::from_str::<Value>` reads (it is driven by
//! `serde_json`'s own parser, with its depth limit and its errors), keeps the last of repeated
//! keys as `Value` does, and orders each object's members as `serde_json::Map` does, so the text
//! and the violations are the ones the tree gave.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use jsonschema::JsonType;
use jsonschema::json::{Array, Json, Node, NodeIdentity, Object};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Number, Value};

use crate::outcome::CallArguments;
use crate::surrogates;

/// A call's validated arguments, shared by the batch, the handler and the record: the compact
/// JSON text (each object's keys sorted, as `serde_json::Value` writes them), and the parsed
/// [`Value`], made the first time something reads it. Cloning shares the text.
///
/// It reads as the `Value` it holds (`Deref`), so `&arguments` goes wherever a `&Value` does.
///
/// ```
/// use agentloop::tool::Arguments;
/// use serde_json::json;
///
/// let arguments = Arguments::new(json!({"path": "src/lib.rs", "limit": 10}));
/// assert_eq!(arguments.as_str(), r#"{"limit":10,"path":"src/lib.rs"}"#);
/// assert_eq!(arguments["path"], "src/lib.rs");
/// ```
#[derive(Clone)]
pub struct Arguments {
    /// The text, shared with the call's record: one allocation a call for both.
    text: CallArguments,
    /// Boxed, so that the handle stays small in every admitted call and slot that holds one
    /// (most calls never read it).
    value: OnceLock<Box<Value>>,
}

impl Arguments {
    /// The arguments `value`, its text written now.
    pub fn new(value: Value) -> Self {
        Arguments {
            text: CallArguments::new(&value),
            value: OnceLock::from(Box::new(value)),
        }
    }

    /// Arguments whose tree is made only if something reads it.
    pub(crate) fn from_text(text: CallArguments) -> Self {
        Arguments {
            text,
            value: OnceLock::new(),
        }
    }

    /// The compact JSON text.
    pub fn as_str(&self) -> &str {
        self.text.as_str()
    }

    /// The arguments as a [`Value`], parsed from the text the first time.
    pub fn value(&self) -> &Value {
        self.value.get_or_init(|| Box::new(self.text.to_value()))
    }

    /// A `Value` of one's own: the parsed one copied when it was made, else parsed from the text
    /// (and not kept).
    pub fn to_value(&self) -> Value {
        match self.value.get() {
            Some(value) => Value::clone(value),
            None => self.text.to_value(),
        }
    }

    /// The text, for a record.
    pub(crate) fn into_record(self) -> CallArguments {
        self.text
    }
}

impl Deref for Arguments {
    type Target = Value;

    fn deref(&self) -> &Value {
        self.value()
    }
}

impl From<Value> for Arguments {
    fn from(value: Value) -> Self {
        Arguments::new(value)
    }
}

// The text is the compact serialization of the value, so equal texts are equal values.
impl PartialEq for Arguments {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Debug for Arguments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

/// Where a span's text is: the arguments' text itself, or the strings decoded from escapes.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
    decoded: bool,
}

/// A run of a container's children in [`Tape::items`] or [`Tape::members`].
#[derive(Debug, Clone, Copy)]
struct Run {
    start: u32,
    len: u32,
}

/// One value of the text.
#[derive(Debug, Clone)]
enum Entry {
    Null,
    Bool(bool),
    Number(Number),
    Str(Span),
    Array(Run),
    Object(Run),
}

/// A member being read: its key, its value's entry and its place among the object's members.
type Member = (Span, u32, u32);

/// The text read into flat vectors; reused from call to call on a thread.
#[derive(Debug, Default)]
pub(crate) struct Tape {
    entries: Vec<Entry>,
    /// Each array's elements (entry indices), a run per array.
    items: Vec<u32>,
    /// Each object's members (key, value entry), a run per object in the order the object's
    /// `serde_json::Map` would iterate them, repeated keys removed.
    members: Vec<(Span, u32)>,
    /// Strings with escapes, decoded.
    decoded: String,
    /// The elements and members of the containers still being read.
    open_items: Vec<u32>,
    open_members: Vec<Member>,
}

/// A tape past these sizes is given back rather than kept for the thread's next call.
const KEPT_ENTRIES: usize = 4096;
const KEPT_TEXT: usize = 64 * 1024;

thread_local! {
    /// The thread's tape, taken for a read and put back after (a pointer, not the vectors, moves):
    /// a read inside a read (a custom keyword that reads arguments) finds it gone and uses a tape
    /// of its own.
    static TAPE: Cell<Option<Box<Tape>>> = const { Cell::new(None) };
}

/// Reads `raw` (empty or blank text is `{}`: the model meant no arguments) and calls `f` with
/// its root, or with why it is not JSON.
pub(crate) fn with_parsed<T>(
    raw: &str,
    f: impl FnOnce(Result<ArgNode<'_>, serde_json::Error>) -> T,
) -> T {
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let mut tape = TAPE.try_with(Cell::take).ok().flatten().unwrap_or_default();
    let out = parse_into(&mut tape, raw, f);
    let oversized = tape.entries.capacity() > KEPT_ENTRIES
        || tape.items.capacity() > KEPT_ENTRIES
        || tape.members.capacity() > KEPT_ENTRIES
        || tape.decoded.capacity() > KEPT_TEXT;
    if !oversized {
        let _ = TAPE.try_with(|cell| cell.set(Some(tape)));
    }
    out
}

fn parse_into<T>(
    tape: &mut Tape,
    raw: &str,
    f: impl FnOnce(Result<ArgNode<'_>, serde_json::Error>) -> T,
) -> T {
    tape.clear();
    let root = match tape.read(raw) {
        Ok(root) => root,
        // A lone half of a UTF-16 pair in a string the model wrote (`"\ud83d"`) is that
        // character lost, not the call: read as U+FFFD, as the providers read the fields they
        // read whole (`surrogates`). Only a failed read looks for one.
        Err(e) => {
            let Some(repaired) = surrogates::replace_lone_str(raw) else {
                return f(Err(e));
            };
            tape.clear();
            let root = tape.read(&repaired);
            let tape: &Tape = tape;
            return f(root.map(|at| {
                ArgNode::At(
                    Doc {
                        tape,
                        raw: &repaired,
                    },
                    at,
                )
            }));
        }
    };
    let tape: &Tape = tape;
    f(Ok(ArgNode::At(Doc { tape, raw }, root)))
}

impl Tape {
    fn clear(&mut self) {
        self.entries.clear();
        self.items.clear();
        self.members.clear();
        self.decoded.clear();
        self.open_items.clear();
        self.open_members.clear();
    }

    fn read(&mut self, raw: &str) -> Result<u32, serde_json::Error> {
        if u32::try_from(raw.len()).is_err() {
            return Err(de::Error::custom("the arguments are larger than 4 GiB"));
        }
        let mut de = serde_json::Deserializer::from_str(raw);
        let root = Reader { tape: self, raw }.deserialize(&mut de)?;
        de.end()?;
        Ok(root)
    }

    fn push(&mut self, entry: Entry) -> Result<u32, String> {
        let at = u32::try_from(self.entries.len()).map_err(|_| "too many values".to_owned())?;
        self.entries.push(entry);
        Ok(at)
    }

    fn entry(&self, at: u32) -> &Entry {
        self.entries.get(at as usize).unwrap_or(&Entry::Null)
    }
}

/// Reads one value of `raw` into the tape; its entry's index is the result.
struct Reader<'t, 'r> {
    tape: &'t mut Tape,
    raw: &'r str,
}

impl Reader<'_, '_> {
    /// Where `s` is kept: its place in the text when it is a slice of it (no escapes), else
    /// copied into the decoded strings.
    fn span(&mut self, s: &str) -> Result<Span, String> {
        let len = u32::try_from(s.len()).map_err(|_| "a string past 4 GiB".to_owned())?;
        let start = (s.as_ptr() as usize).wrapping_sub(self.raw.as_ptr() as usize);
        if start <= self.raw.len() && self.raw.len() - start >= s.len() {
            // Within the text, which is under 4 GiB (`Tape::read`).
            return Ok(Span {
                start: start as u32,
                len,
                decoded: false,
            });
        }
        let start = u32::try_from(self.tape.decoded.len())
            .map_err(|_| "decoded strings past 4 GiB".to_owned())?;
        self.tape.decoded.push_str(s);
        Ok(Span {
            start,
            len,
            decoded: true,
        })
    }

    fn string<E: de::Error>(mut self, s: &str) -> Result<u32, E> {
        let span = self.span(s).map_err(E::custom)?;
        self.tape.push(Entry::Str(span)).map_err(E::custom)
    }

    fn reborrow(&mut self) -> Reader<'_, '_> {
        Reader {
            tape: self.tape,
            raw: self.raw,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Reader<'_, '_> {
    type Value = u32;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u32, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Reader<'_, '_> {
    type Value = u32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<u32, E> {
        self.tape.push(Entry::Null).map_err(E::custom)
    }

    fn visit_none<E: de::Error>(self) -> Result<u32, E> {
        self.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<u32, E> {
        self.tape.push(Entry::Bool(v)).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u32, E> {
        self.tape.push(Entry::Number(v.into())).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
        self.tape.push(Entry::Number(v.into())).map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u32, E> {
        // As `Value` reads it: a number with no finite `f64` is null.
        let entry = Number::from_f64(v).map_or(Entry::Null, Entry::Number);
        self.tape.push(entry).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u32, E> {
        self.string(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<u32, A::Error> {
        let mark = self.tape.open_items.len();
        while let Some(at) = seq.next_element_seed(self.reborrow())? {
            self.tape.open_items.push(at);
        }
        let tape = &mut *self.tape;
        let run =
            run_at(tape.items.len(), tape.open_items.len() - mark).map_err(de::Error::custom)?;
        tape.items.extend(tape.open_items.drain(mark..));
        tape.push(Entry::Array(run)).map_err(de::Error::custom)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<u32, A::Error> {
        let mark = self.tape.open_members.len();
        let mut place = 0u32;
        while let Some(key) = map.next_key_seed(KeyReader(self.reborrow()))? {
            let value = map.next_value_seed(self.reborrow())?;
            self.tape.open_members.push((key, value, place));
            place = place.saturating_add(1);
        }
        let Tape {
            open_members,
            members,
            decoded,
            ..
        } = &mut *self.tape;
        let open = open_members.get_mut(mark..).unwrap_or_default();
        let kept = order_members(open, |span| span_text(self.raw, decoded, span));
        let run = run_at(members.len(), kept).map_err(de::Error::custom)?;
        members.extend(open.iter().take(kept).map(|&(key, value, _)| (key, value)));
        open_members.truncate(mark);
        self.tape
            .push(Entry::Object(run))
            .map_err(de::Error::custom)
    }
}

fn run_at(start: usize, len: usize) -> Result<Run, &'static str> {
    let start = u32::try_from(start).map_err(|_| "too many values")?;
    let len = u32::try_from(len).map_err(|_| "too many values")?;
    Ok(Run { start, len })
}

/// A span's text: in the arguments' text or in the decoded strings.
fn span_text<'a>(raw: &'a str, decoded: &'a str, span: Span) -> &'a str {
    let from = if span.decoded { decoded } else { raw };
    let start = span.start as usize;
    from.get(start..start + span.len as usize)
        .unwrap_or_default()
}

/// Whether `serde_json` keeps objects in insertion order (its `preserve_order` feature, which
/// any crate of a build can turn on): its map is then an `IndexMap`, not a `BTreeMap`.
const INSERTION_ORDERED: bool = std::mem::size_of::<serde_json::Map<String, Value>>()
    != std::mem::size_of::<std::collections::BTreeMap<String, Value>>();

/// Orders an object's members as its `serde_json::Map` would iterate them, a repeated key kept
/// once with its last value (as `Value` keeps it): the kept members are moved to the front of
/// `open`, and their count returned. Sorting by key and place allocates nothing, whatever the
/// object's size.
fn order_members<'a>(open: &mut [Member], text: impl Fn(Span) -> &'a str) -> usize {
    // Written in order with no key twice (as a model or a program often writes them): kept as
    // they are.
    if !INSERTION_ORDERED
        && open.windows(2).all(|w| match w {
            [a, b] => text(a.0) < text(b.0),
            _ => true,
        })
    {
        return open.len();
    }
    open.sort_unstable_by(|a, b| text(a.0).cmp(text(b.0)).then(a.2.cmp(&b.2)));
    let mut kept = 0;
    let mut first_place = None;
    for i in 0..open.len() {
        let Some(&(key, _, place)) = open.get(i) else {
            break;
        };
        let first = *first_place.get_or_insert(place);
        let last_of_key = open.get(i + 1).is_none_or(|next| text(next.0) != text(key));
        if !last_of_key {
            continue;
        }
        // The last value under the key; in an insertion-ordered map, at the key's first place.
        if let Some(member) = open.get_mut(i) {
            member.2 = first;
        }
        // `kept <= i`: the members before `i` are all placed or dropped.
        open.swap(kept, i);
        kept += 1;
        first_place = None;
    }
    if INSERTION_ORDERED && let Some(members) = open.get_mut(..kept) {
        members.sort_unstable_by_key(|m| m.2);
    }
    kept
}

/// Reads an object's key into the tape's strings.
struct KeyReader<'t, 'r>(Reader<'t, 'r>);

impl<'de> DeserializeSeed<'de> for KeyReader<'_, '_> {
    type Value = Span;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Span, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyReader<'_, '_> {
    type Value = Span;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<Span, E> {
        self.0.span(v).map_err(E::custom)
    }
}

/// The arguments' text and its tape, read together.
#[derive(Clone, Copy)]
pub(crate) struct Doc<'a> {
    tape: &'a Tape,
    raw: &'a str,
}

impl<'a> Doc<'a> {
    fn text(self, span: Span) -> &'a str {
        span_text(self.raw, &self.tape.decoded, span)
    }

    fn node(self, at: u32) -> ArgNode<'a> {
        ArgNode::At(self, at)
    }

    fn items(self, run: Run) -> &'a [u32] {
        let start = run.start as usize;
        self.tape
            .items
            .get(start..start + run.len as usize)
            .unwrap_or_default()
    }

    fn members(self, run: Run) -> &'a [(Span, u32)] {
        let start = run.start as usize;
        self.tape
            .members
            .get(start..start + run.len as usize)
            .unwrap_or_default()
    }
}

/// The representation `jsonschema` validates a call's arguments in: the tape.
pub(crate) struct ArgsJson;

/// One value of the arguments, or a key being validated as a string (`propertyNames`).
#[derive(Clone, Copy)]
pub(crate) enum ArgNode<'a> {
    At(Doc<'a>, u32),
    Name(&'a str),
}

impl<'a> ArgNode<'a> {
    fn entry(&self) -> Option<(Doc<'a>, &'a Entry)> {
        match *self {
            ArgNode::At(doc, at) => Some((doc, doc.tape.entry(at))),
            ArgNode::Name(_) => None,
        }
    }

    /// The value as a `Value` tree.
    pub(crate) fn value(&self) -> Value {
        let Some((doc, entry)) = self.entry() else {
            return match self {
                ArgNode::Name(name) => Value::String((*name).to_owned()),
                ArgNode::At(..) => Value::Null,
            };
        };
        match entry {
            Entry::Null => Value::Null,
            Entry::Bool(b) => Value::Bool(*b),
            Entry::Number(n) => Value::Number(n.clone()),
            Entry::Str(span) => Value::String(doc.text(*span).to_owned()),
            Entry::Array(run) => Value::Array(
                doc.items(*run)
                    .iter()
                    .map(|&at| doc.node(at).value())
                    .collect(),
            ),
            Entry::Object(run) => Value::Object(
                doc.members(*run)
                    .iter()
                    .map(|&(key, at)| (doc.text(key).to_owned(), doc.node(at).value()))
                    .collect(),
            ),
        }
    }
}

impl Json for ArgsJson {
    type Node<'a> = ArgNode<'a>;
    type PreparedKey = Box<str>;
    type StringBuffer = ();

    // A lookup is a binary search that compares bytes at every probe, as `serde_json`'s
    // `BTreeMap` does: the same trade-off as `SerdeJson`'s.
    const KEYS_PER_LOOKUP: usize = 2;
    // A tree: no node is its own descendant.
    const ACYCLIC: bool = true;

    fn prepare_key(key: &str) -> Box<str> {
        Box::from(key)
    }

    fn with_string_node<T>((): &mut (), string: &str, f: impl FnOnce(ArgNode<'_>) -> T) -> T {
        f(ArgNode::Name(string))
    }
}

impl<'a> Node<'a, ArgsJson> for ArgNode<'a> {
    type Object = ArgObject<'a>;
    type Array = ArgArray<'a>;
    type Number = &'a Number;

    fn as_object(&self) -> Option<ArgObject<'a>> {
        match self.entry()? {
            (doc, Entry::Object(run)) => Some(ArgObject {
                doc,
                members: doc.members(*run),
            }),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<ArgArray<'a>> {
        match self.entry()? {
            (doc, Entry::Array(run)) => Some(ArgArray {
                doc,
                items: doc.items(*run),
            }),
            _ => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match self.entry() {
            None => match *self {
                ArgNode::Name(name) => Some(Cow::Borrowed(name)),
                ArgNode::At(..) => None,
            },
            Some((doc, Entry::Str(span))) => Some(Cow::Borrowed(doc.text(*span))),
            Some(_) => None,
        }
    }

    fn as_number(&self) -> Option<&'a Number> {
        match self.entry()? {
            (_, Entry::Number(n)) => Some(n),
            _ => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        match self.entry()? {
            (_, Entry::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        matches!(self.entry(), Some((_, Entry::Null)))
    }

    fn json_type(&self) -> JsonType {
        match self.entry() {
            None => JsonType::String,
            Some((_, entry)) => match entry {
                Entry::Null => JsonType::Null,
                Entry::Bool(_) => JsonType::Boolean,
                Entry::Number(_) => JsonType::Number,
                Entry::Str(_) => JsonType::String,
                Entry::Array(_) => JsonType::Array,
                Entry::Object(_) => JsonType::Object,
            },
        }
    }

    fn to_value(&self) -> Cow<'a, Value> {
        Cow::Owned(self.value())
    }

    fn identity(&self) -> Option<NodeIdentity> {
        match *self {
            ArgNode::At(doc, at) => Some(NodeIdentity::tagged(
                std::ptr::from_ref::<Tape>(doc.tape) as usize,
                at,
            )),
            ArgNode::Name(name) => Some(NodeIdentity::tagged(name.as_ptr() as usize, u32::MAX)),
        }
    }
}

/// An object of the arguments: its members in `serde_json::Map`'s order.
pub(crate) struct ArgObject<'a> {
    doc: Doc<'a>,
    members: &'a [(Span, u32)],
}

impl<'a> Object<'a, ArgsJson> for ArgObject<'a> {
    type Node = ArgNode<'a>;
    type MemberName = &'a str;
    type MembersIter = ArgMembers<'a>;

    fn len(&self) -> usize {
        self.members.len()
    }

    fn get(&self, key: &Box<str>) -> Option<ArgNode<'a>> {
        let doc = self.doc;
        let found = if INSERTION_ORDERED {
            self.members.iter().find(|m| doc.text(m.0) == &**key)
        } else {
            self.members
                .binary_search_by(|m| doc.text(m.0).cmp(key))
                .ok()
                .and_then(|i| self.members.get(i))
        };
        found.map(|&(_, at)| doc.node(at))
    }

    fn members(&self) -> ArgMembers<'a> {
        ArgMembers {
            doc: self.doc,
            members: self.members.iter(),
        }
    }
}

/// The members of an [`ArgObject`].
pub(crate) struct ArgMembers<'a> {
    doc: Doc<'a>,
    members: std::slice::Iter<'a, (Span, u32)>,
}

impl<'a> Iterator for ArgMembers<'a> {
    type Item = (&'a str, ArgNode<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let &(key, at) = self.members.next()?;
        Some((self.doc.text(key), self.doc.node(at)))
    }
}

/// An array of the arguments.
pub(crate) struct ArgArray<'a> {
    doc: Doc<'a>,
    items: &'a [u32],
}

impl<'a> Array<'a, ArgsJson> for ArgArray<'a> {
    type Node = ArgNode<'a>;
    type ElementsIter = ArgItems<'a>;

    fn len(&self) -> usize {
        self.items.len()
    }

    fn elements(&self) -> ArgItems<'a> {
        ArgItems {
            doc: self.doc,
            items: self.items.iter(),
        }
    }
}

/// The elements of an [`ArgArray`].
pub(crate) struct ArgItems<'a> {
    doc: Doc<'a>,
    items: std::slice::Iter<'a, u32>,
}

impl<'a> Iterator for ArgItems<'a> {
    type Item = ArgNode<'a>;

    fn next(&mut self) -> Option<ArgNode<'a>> {
        self.items.next().map(|&at| self.doc.node(at))
    }
}

// Writes what the `Value` would write: the same calls of the serializer in the same order.
impl Serialize for ArgNode<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some((doc, entry)) = self.entry() else {
            return match self {
                ArgNode::Name(name) => serializer.serialize_str(name),
                ArgNode::At(..) => serializer.serialize_unit(),
            };
        };
        match entry {
            Entry::Null => serializer.serialize_unit(),
            Entry::Bool(b) => serializer.serialize_bool(*b),
            Entry::Number(n) => n.serialize(serializer),
            Entry::Str(span) => serializer.serialize_str(doc.text(*span)),
            Entry::Array(run) => {
                let items = doc.items(*run);
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for &at in items {
                    seq.serialize_element(&doc.node(at))?;
                }
                seq.end()
            }
            Entry::Object(run) => {
                let members = doc.members(*run);
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for &(key, at) in members {
                    map.serialize_entry(doc.text(key), &doc.node(at))?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// What the arguments' text comes to when read through the tape: the record's text, the
    /// `Value`, or the parser's error.
    fn read(raw: &str) -> Result<(String, Value), String> {
        with_parsed(raw, |root| {
            root.map(|root| (CallArguments::of(&root).as_str().to_owned(), root.value()))
                .map_err(|e| e.to_string())
        })
    }

    /// The same through a `Value`, as the run read arguments before the tape (a lone surrogate
    /// escape read as U+FFFD, as the tape reads it).
    fn read_as_value(raw: &str) -> Result<(String, Value), String> {
        let raw = if raw.trim().is_empty() { "{}" } else { raw };
        crate::surrogates::from_str::<Value>(raw, &mut None)
            .map(|v| (CallArguments::new(&v).as_str().to_owned(), v))
            .map_err(|e| e.to_string())
    }

    fn violations<'v, F: Json>(
        validator: &'v jsonschema::Validator<F>,
        node: F::Node<'v>,
    ) -> Vec<(String, String)> {
        validator
            .iter_errors(node)
            .map(|e| (e.instance_path().to_string(), e.to_string()))
            .collect()
    }

    #[test]
    fn repeated_keys_keep_the_last_value_and_keys_come_sorted() {
        let raw = r#"{"b": 1, "a": {"y": [1, 2.5, -3], "x": null}, "b": "two", "é\n": true}"#;
        assert_eq!(read(raw), read_as_value(raw));
        let (text, _) = read(raw).unwrap();
        assert_eq!(
            text,
            r#"{"a":{"x":null,"y":[1,2.5,-3]},"b":"two","é\n":true}"#
        );
    }

    #[test]
    fn escaped_strings_and_keys_are_decoded() {
        let raw = r#"{"k\u0041y": "line\nbreak \"quoted\" \ud83d\ude00", "plain": "x"}"#;
        assert_eq!(read(raw), read_as_value(raw));
        let (_, value) = read(raw).unwrap();
        assert_eq!(value["kAy"], "line\nbreak \"quoted\" 😀");
    }

    #[test]
    fn blank_text_is_no_arguments_and_bad_text_fails_as_serde_json_says() {
        assert_eq!(read("  \n").unwrap().0, "{}");
        for bad in [
            "{",
            r#"{"a": }"#,
            r#"{"a": 1} trailing"#,
            "[1, 2,]",
            r#"{"a": 1e999}"#,
            "nul",
        ] {
            assert_eq!(read(bad), read_as_value(bad), "{bad}");
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_lone_surrogate_reads_as_the_replacement_character_and_a_pair_as_its_character() {
        // A high half at a string's end, a low half alone, one in a key, one before text; the
        // unescaped strings beside them are read from the repaired text.
        let raw = r#"{"s": "a\ud800", "k\udc00": ["\ud83d\ude00", "\ud83dx", "plain"], "n": 1}"#;
        let (text, value) = read(raw).unwrap();
        let expected = json!({
            "s": "a\u{fffd}",
            "k\u{fffd}": ["\u{1F600}", "\u{fffd}x", "plain"],
            "n": 1,
        });
        assert_eq!(value, expected);
        assert_eq!(text, expected.to_string());
        assert_eq!(read(r#""\ud800""#).unwrap().1, json!("\u{fffd}"));
        // A pair, and an escaped backslash before `ud800`, are not lone halves: read as before.
        for kept in [r#"{"p": "\ud83d\ude00"}"#, r#"{"p": "\\ud800"}"#] {
            assert_eq!(read(kept), read_as_value(kept), "{kept}");
        }
        // Text that is not JSON for another reason fails as it did, whatever halves it holds.
        for bad in [
            r#"{"s": "\ud800",}"#,
            r#"{"s": "\ud800"} x"#,
            r#"{"s": "\ud800"#,
        ] {
            let e = read(bad).unwrap_err();
            assert!(
                !e.contains("surrogate") && !e.contains("hex escape"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn nesting_past_serde_jsons_limit_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(read(&deep), read_as_value(&deep));
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(read(&ok), read_as_value(&ok));
    }

    #[test]
    fn a_read_inside_a_read_uses_a_tape_of_its_own() {
        let outer = with_parsed(r#"{"a": [1, {"b": "c"}]}"#, |root| {
            let inner = read(r#"{"z": 26}"#);
            (root.map(|r| r.value()).ok(), inner)
        });
        assert_eq!(outer.0, Some(json!({"a": [1, {"b": "c"}]})));
        assert_eq!(outer.1.unwrap().1, json!({"z": 26}));
    }

    #[test]
    fn arguments_read_as_their_value_and_keep_their_text() {
        let arguments = Arguments::new(json!({"b": [1, 2], "a": "x"}));
        assert_eq!(arguments.as_str(), r#"{"a":"x","b":[1,2]}"#);
        assert_eq!(*arguments, json!({"a": "x", "b": [1, 2]}));
        let lazy = Arguments::from_text(CallArguments::new(&json!({"n": 1})));
        assert_eq!(lazy.to_value(), json!({"n": 1}));
        assert_eq!(lazy["n"], 1);
        let shared = lazy.clone();
        assert_eq!(shared, lazy);
        assert_eq!(lazy.into_record().as_str(), r#"{"n":1}"#);
        assert_eq!(shared.into_record().as_str(), r#"{"n":1}"#);
    }

    /// A schema that touches every kind of keyword the tape answers: types, properties and
    /// their absence, names, lengths, numbers, enums and constants, arrays and their uniqueness,
    /// references and combinators.
    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
                "n": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10, "multipleOf": 2},
                "x": {"type": "number"},
                "kind": {"enum": ["a", "b", {"c": [1]}]},
                "fixed": {"const": {"k": [1, "v"]}},
                "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "uniqueItems": true, "maxItems": 3},
                "either": {"oneOf": [{"type": "string"}, {"type": "boolean"}]},
                "maybe": {"type": ["null", "string"]}
            },
            "required": ["name"],
            "propertyNames": {"maxLength": 6},
            "additionalProperties": false,
            "$defs": {"item": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}}
        })
    }

    #[test]
    fn the_tape_fails_a_schema_where_the_value_does_and_says_the_same() {
        let schema = schema();
        let on_tape = jsonschema::options_for::<ArgsJson>()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&schema)
            .unwrap();
        let on_value = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&schema)
            .unwrap();
        let cases = [
            r#"{"name": "abc", "n": 4, "x": 1.5, "kind": {"c": [1]}, "fixed": {"k": [1, "v"]}}"#,
            r#"{"name": "a"}"#,
            r#"{"name": "ABCDEFG", "n": 11}"#,
            r#"{"n": 3, "x": "no"}"#,
            r#"{"name": "ab", "kind": "z", "fixed": {"k": [1]}}"#,
            r#"{"name": "ab", "items": [{"id": 1}, {"id": 1}, {"id": "x"}, {}]}"#,
            r#"{"name": "ab", "either": 3, "maybe": null, "toolongname": 1}"#,
            r#"{"name": "ab", "name": 5}"#,
            r#"[1, 2]"#,
            r#""text""#,
        ];
        for raw in cases {
            let value: Value = serde_json::from_str(raw).unwrap();
            let expected = violations(&on_value, &value);
            let got = with_parsed(raw, |root| violations(&on_tape, root.unwrap()));
            assert_eq!(got, expected, "{raw}");
            assert_eq!(
                with_parsed(raw, |root| on_tape.is_valid(root.unwrap())),
                on_value.is_valid(&value),
                "{raw}"
            );
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            (-1e12f64..1e12).prop_map(|f| json!(f)),
            "[a-c\\\\\"\n\u{e9}\u{1F600}]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("[a-c\"\\\\]{0,3}", inner), 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Text as a model might write it: spaces, keys in any order, repeated keys, escapes.
    fn written(value: &Value, rng: &mut u64) -> String {
        fn next(rng: &mut u64) -> u64 {
            *rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *rng >> 33
        }
        match value {
            Value::Object(map) => {
                let mut members: Vec<String> = Vec::new();
                for (k, v) in map.iter().rev() {
                    let key = serde_json::to_string(k).unwrap().replace('a', "\\u0061");
                    if next(rng).is_multiple_of(3) {
                        members.push(format!("{key}: \"shadowed\""));
                    }
                    members.push(format!("{key} : {}", written(v, rng)));
                }
                format!("{{ {} }}", members.join(" ,\n"))
            }
            Value::Array(items) => format!(
                "[{}]",
                items
                    .iter()
                    .map(|v| written(v, rng))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn the_tape_reads_any_text_as_the_value_does(value in any_json(), seed in any::<u64>()) {
            let mut rng = seed;
            let raw = written(&value, &mut rng);
            prop_assert_eq!(read(&raw), read_as_value(&raw));
        }

        #[test]
        fn the_tape_reads_any_bytes_as_the_value_does(raw in "[\\[\\]{}\",:0-9a-z\\\\ .eE+-]{0,24}") {
            prop_assert_eq!(read(&raw), read_as_value(&raw));
        }
    }
}
