"""A small JSON Schema (draft 2020-12) validator for the subset the schemas
in docs/schemas use. Python standard library only.

Keywords: type (a name or a list), required, properties,
additionalProperties (true, false or a schema), propertyNames, enum, const,
pattern, minLength, maxLength, minimum, maximum, maxProperties, allOf,
if/then. Annotations ($schema, $id, title, description, format, examples,
$comment) are ignored, as 2020-12 does by default: our schemas enforce
"format" with a pattern. Any other keyword raises SchemaError, so a schema
can never lean on a keyword this checker silently skips.

As the specification says: "integer" is any number with a zero fractional
part (1.0 is one), true and false are not numbers (const 1 does not match
true), lengths count code points, and a pattern is a search (not anchored)
whose "$" means the end of the string ("abc\\n" does not match "^abc$",
as in ECMA-262). Patterns must keep to syntax that means the same in
Python and ECMA-262 (no \\d, \\w: they are Unicode-wide in Python).

errors(schema, instance) returns a list of "path: message" strings, empty
when the instance is valid; check(...) is errors(...) == [].
"""
import json
import math
import os
import re

ANNOTATIONS = {"$schema", "$id", "title", "description", "format", "examples", "$comment"}
KEYWORDS = {"type", "required", "properties", "additionalProperties", "propertyNames",
            "enum", "const", "pattern", "minLength", "maxLength", "minimum", "maximum",
            "maxProperties", "allOf", "if", "then"}


class SchemaError(Exception):
    """The schema itself uses a keyword or a value this checker does not know."""


def load(name):
    """A schema of docs/schemas by file name."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "docs", "schemas", name), encoding="utf-8") as f:
        return json.load(f)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_type(v, t):
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "number":
        return _is_number(v) and not (isinstance(v, float) and not math.isfinite(v))
    if t == "integer":
        return (_is_number(v) and (isinstance(v, int) or
                                   (math.isfinite(v) and float(v).is_integer())))
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    raise SchemaError("unknown type %r" % t)


def json_equal(a, b):
    """Equality as JSON Schema means it: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


_compiled = {}


def _regex(pattern):
    """ECMA-262 '$' (end of input without the multiline flag) is Python's \\Z."""
    if pattern not in _compiled:
        p = pattern
        if p.endswith("$") and not p.endswith("\\$"):
            p = p[:-1] + r"\Z"
        _compiled[pattern] = re.compile(p)
    return _compiled[pattern]


def errors(schema, v, path="$"):
    if schema is True:
        return []
    if schema is False:
        return ["%s: no value is allowed here" % path]
    if not isinstance(schema, dict):
        raise SchemaError("%s: a schema must be an object or a boolean" % path)
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise SchemaError("%s: keywords this checker does not implement: %s"
                          % (path, sorted(unknown)))
    out = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(v, t) for t in types):
            out.append("%s: %s is not of type %s" % (path, _show(v), " or ".join(types)))
            return out  # the other keywords would only repeat it
    if "const" in schema and not json_equal(v, schema["const"]):
        out.append("%s: %s is not %s" % (path, _show(v), _show(schema["const"])))
    if "enum" in schema and not any(json_equal(v, e) for e in schema["enum"]):
        out.append("%s: %s is not one of %s" % (path, _show(v), schema["enum"]))
    if isinstance(v, str):
        n = len(v)  # code points
        if "minLength" in schema and n < schema["minLength"]:
            out.append("%s: %d characters, fewer than %d" % (path, n, schema["minLength"]))
        if "maxLength" in schema and n > schema["maxLength"]:
            out.append("%s: %d characters, more than %d" % (path, n, schema["maxLength"]))
        if "pattern" in schema and not _regex(schema["pattern"]).search(v):
            out.append("%s: %s does not match %s" % (path, _show(v), schema["pattern"]))
    if _is_number(v):
        if "minimum" in schema and v < schema["minimum"]:
            out.append("%s: %s is less than %s" % (path, v, schema["minimum"]))
        if "maximum" in schema and v > schema["maximum"]:
            out.append("%s: %s is more than %s" % (path, v, schema["maximum"]))
    if isinstance(v, dict):
        for name in schema.get("required", []):
            if name not in v:
                out.append("%s: %r is missing" % (path, name))
        if "maxProperties" in schema and len(v) > schema["maxProperties"]:
            out.append("%s: %d properties, more than %d" % (path, len(v), schema["maxProperties"]))
        props = schema.get("properties", {})
        for k, x in v.items():
            if "propertyNames" in schema:
                out += errors(schema["propertyNames"], k, "%s[name %r]" % (path, k))
            if k in props:
                out += errors(props[k], x, "%s.%s" % (path, k))
            elif "additionalProperties" in schema:
                ap = schema["additionalProperties"]
                if ap is False:
                    out.append("%s: property %r is not allowed" % (path, k))
                else:
                    out += errors(ap, x, "%s.%s" % (path, k))
    for i, sub in enumerate(schema.get("allOf", [])):
        out += errors(sub, v, path)
    if "if" in schema:
        if not errors(schema["if"], v, path):
            out += errors(schema.get("then", True), v, path)
    elif "then" in schema:
        raise SchemaError("%s: 'then' without 'if'" % path)
    return out


def check(schema, v):
    return not errors(schema, v)


def _show(v):
    s = json.dumps(v)
    return s if len(s) <= 60 else s[:57] + "..."
