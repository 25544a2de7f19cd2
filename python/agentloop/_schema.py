"""A tool's JSON Schema from a Python function's signature, type hints and docstring.

With pydantic installed the arguments are one pydantic model (so pydantic models, dataclasses,
constraints and nested types are described and validated as pydantic does); without it, a small
mapping covers the types of the standard library. The Rust runtime validates every call's
arguments against this schema before any tool runs."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

try:  # pydantic is optional
    import pydantic
except ImportError:  # pragma: no cover - exercised where pydantic is absent
    pydantic = None  # type: ignore[assignment]

_NoneType = type(None)


@dataclasses.dataclass
class Signature:
    """What a function's signature says: the schema, and how to turn the validated JSON
    arguments into the function's keyword arguments."""

    description: str
    schema: Dict[str, Any]
    convert: Callable[[Dict[str, Any]], Dict[str, Any]]


def describe(
    fn: Callable[..., Any],
    description: Optional[str] = None,
    localns: Optional[Dict[str, Any]] = None,
) -> Signature:
    """The schema of ``fn``'s parameters and its description (the docstring's text before its
    parameter section, unless ``description`` is given). ``localns``: the names of the scope it
    was made in, for annotations that name its local classes."""
    doc = inspect.getdoc(fn) or ""
    summary, param_docs = _parse_docstring(doc)
    hints = _hints(fn, localns)
    params: List[Tuple[str, Any, Any]] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name_of(fn)}: *args and **kwargs have no schema")
        params.append((p.name, hints.get(p.name, Any), p.default))
    if pydantic is not None:
        schema, convert = _pydantic_schema(fn, params, param_docs)
    else:
        schema, convert = _plain_schema(params, param_docs)
    return Signature(description if description is not None else summary, schema, convert)


def name_of(fn: Callable[..., Any]) -> str:
    """A callable's name: a function's, a ``functools.partial``'s function's, or the class of a
    callable object."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _hints(fn: Callable[..., Any], localns: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Its parameters' type hints, string annotations (``from __future__ import annotations``)
    resolved in its module and ``localns``; one that cannot be resolved stays a string, the others
    resolved all the same."""
    try:
        return typing.get_type_hints(fn, localns=localns, include_extras=True)
    except Exception:  # an unresolvable forward reference: resolve the others one by one
        pass
    globalns = getattr(fn, "__globals__", None) or getattr(getattr(fn, "func", None), "__globals__", {})
    hints: Dict[str, Any] = {}
    for name, annotation in dict(getattr(fn, "__annotations__", {})).items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(globalns), dict(localns or {}))  # noqa: S307
            except Exception:
                pass
        hints[name] = annotation
    return hints


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params):\s*$")
_GOOGLE_PARAM = re.compile(r"^\s+(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:\S+\s+)?(\w+):\s*(.*)$")
_OTHER_SECTION = re.compile(r"^(Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")


def _parse_docstring(doc: str) -> Tuple[str, Dict[str, str]]:
    """The summary, and each parameter's description (Google ``Args:`` or Sphinx ``:param:``)."""
    summary: List[str] = []
    params: Dict[str, str] = {}
    section: Optional[str] = None  # "args", another section's name, or None for the summary
    current: Optional[str] = None
    arg_indent: Optional[int] = None
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif _SECTION.match(stripped):
            section, current, arg_indent = "args", None, None
        elif _OTHER_SECTION.match(stripped) or stripped.startswith(":"):
            section, current = "other", None
        elif section == "args" and stripped:
            google = _GOOGLE_PARAM.match(line)
            if google and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = google.group(1).lstrip("*")
                params[current] = google.group(2).strip()
            elif current:
                params[current] = (params[current] + " " + stripped).strip()
        elif section == "sphinx" and current and stripped:
            params[current] = (params[current] + " " + stripped).strip()
        elif section is None:
            summary.append(line)
    return "\n".join(summary).strip(), params


def _pydantic_schema(
    fn: Callable[..., Any],
    params: List[Tuple[str, Any, Any]],
    docs: Dict[str, str],
) -> Tuple[Dict[str, Any], Callable[[Dict[str, Any]], Dict[str, Any]]]:
    assert pydantic is not None
    # Each parameter is a field of a name of ours, its own name the alias: a parameter may be
    # named as BaseModel's attributes (``json``, ``copy``, ``schema``, ``model_config``) or begin
    # with ``_``, which a field's name may not.
    fields: Dict[str, Any] = {}
    for i, (name, hint, default) in enumerate(params):
        info = pydantic.Field(
            default=... if default is inspect.Parameter.empty else default,
            description=docs.get(name),
            alias=name,
        )
        fields[f"p{i}"] = (hint, info)
    model = pydantic.create_model(
        f"{name_of(fn)}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)

    def convert(args: Dict[str, Any]) -> Dict[str, Any]:
        validated = model.model_validate(args)
        return {name: getattr(validated, f"p{i}") for i, (name, _, _) in enumerate(params)}

    # The runtime has validated the arguments against the schema already: JSON values of plain
    # types need no second pass (a tool call's hot path).
    if all(_is_plain(hint) for _, hint, _ in params):
        return schema, _unchanged
    return schema, convert


_PLAIN = (str, int, float, bool, type(None))


def _is_plain(hint: Any) -> bool:
    """True for a type whose JSON value is already the Python value (``str``, ``list[int]``...)."""
    if hint is Any or hint in _PLAIN:
        return hint is not float  # an integral JSON number must still become a float
    origin = typing.get_origin(hint)
    if origin in (list, dict) or _is_union(hint):
        return all(_is_plain(a) for a in typing.get_args(hint))
    return hint in (list, dict)


def _unchanged(args: Dict[str, Any]) -> Dict[str, Any]:
    return args


def _plain_schema(
    params: List[Tuple[str, Any, Any]],
    docs: Dict[str, str],
) -> Tuple[Dict[str, Any], Callable[[Dict[str, Any]], Dict[str, Any]]]:
    properties: Dict[str, Any] = {}
    required: List[str] = []
    converters: Dict[str, Callable[[Any], Any]] = {}
    for name, hint, default in params:
        prop = _type_schema(hint)
        if name in docs and docs[name]:
            prop["description"] = docs[name]
        if default is inspect.Parameter.empty:
            required.append(name)
        elif default is None or isinstance(default, (str, int, float, bool)):
            prop["default"] = default
        properties[name] = prop
        converter = _converter(hint)
        if converter is not None:
            converters[name] = converter
    schema: Dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if not converters:
        return schema, _unchanged

    def convert(args: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(args)
        for name, converter in converters.items():
            if name in out:
                out[name] = converter(out[name])
        return out

    return schema, convert


def _converter(hint: Any) -> Optional[Callable[[Any], Any]]:
    """How a validated JSON value becomes the Python value ``hint`` says, wherever the two differ
    (an enum, a float given as an integer, a set, a tuple), or ``None`` where they never do."""
    if typing.get_origin(hint) is typing.Annotated:
        return _converter(typing.get_args(hint)[0])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        cls = hint
        return lambda v: cls(v)
    if hint is float:
        return lambda v: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
    if _is_union(hint):
        base = _strip_optional(hint)
        inner = _converter(base) if base is not hint else None
        if inner is None:
            return None
        return lambda v: None if v is None else inner(v)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (list, set, frozenset) or hint in (set, frozenset):
        item = _converter(args[0]) if args else None
        container: Callable[[Any], Any] = origin or hint
        if item is None:
            return None if container is list else container
        return lambda v: container(item(x) for x in v)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            each = _converter(args[0])
            if each is None:
                return tuple
            return lambda v: tuple(each(x) for x in v)
        items = [_converter(a) or _unchanged_value for a in args]
        return lambda v: tuple(f(x) for f, x in zip(items, v))
    if origin is dict and len(args) == 2:
        value = _converter(args[1])
        if value is None:
            return None
        return lambda v: {k: value(x) for k, x in v.items()}
    return None


def _unchanged_value(value: Any) -> Any:
    return value


def _strip_optional(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not _NoneType]
    if _is_union(hint) and len(args) == 1:
        return args[0]
    return hint


def _is_union(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return True
    if sys.version_info >= (3, 10):
        import types

        return origin is types.UnionType
    return False


def _type_schema(hint: Any) -> Dict[str, Any]:
    """The JSON Schema of one type hint, standard library types only."""
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if typing.get_origin(hint) is typing.Annotated:
        base, *extra = typing.get_args(hint)
        schema = _type_schema(base)
        for e in extra:
            if isinstance(e, str):
                schema["description"] = e
        return schema
    if hint is _NoneType or hint is None:
        return {"type": "null"}
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if _is_union(hint):
        return {"anyOf": [_type_schema(a) for a in typing.get_args(hint)]}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, List, set, frozenset) or hint in (list, set):
        array: Dict[str, Any] = {"type": "array"}
        if args:
            array["items"] = _type_schema(args[0])
        return array
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [_type_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin in (dict, Dict) or hint is dict:
        obj: Dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            obj["additionalProperties"] = _type_schema(args[1])
        return obj
    raise TypeError(
        f"no JSON Schema for the type {hint!r} without pydantic (pip install pydantic)"
    )
