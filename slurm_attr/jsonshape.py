"""One validating loader for JSON that a job, a node or another process wrote: the shape is
a msgspec Struct (types, bounds, defaults), stated once beside its reader.

``strict`` is msgspec's own: the value is the shape or a ``msgspec.ValidationError`` that
names the field. ``lenient`` keeps what the hand-written readers it replaced kept: one
optional field of the wrong type (or out of its bounds) reads as its default, one bad value
of a ``dict[str, V]`` or ``list[V]`` field is left out, and the rest of the object is kept;
only a required field that is missing or wrong fails the object. The callers say per shape
which fields are required (the ones the old reader dropped the whole object for).

Every Struct here ignores unknown fields unless it says otherwise: the writers are other
releases of ours, NCCL, or torch, and a newer writer adding a field must not make an older
reader refuse its file.
"""
from __future__ import annotations

import functools
import types
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec

T = TypeVar("T")
ValidationError = msgspec.ValidationError


def strict(obj: Any, typ: type[T] | Any) -> T:
    """``obj`` (decoded JSON: dicts, lists, str, int, ...) as ``typ``; ValidationError else."""
    return msgspec.convert(obj, type=typ)


def lenient(obj: Any, typ: type[T] | Any) -> T:
    """``obj`` as ``typ``, keeping the good parts of a partly bad object (module doc)."""
    try:
        return msgspec.convert(obj, type=typ)
    except msgspec.ValidationError:
        pass
    return _value(obj, typ)


def _struct(typ: Any) -> type[msgspec.Struct] | None:
    """The Struct a field holds (``S`` or ``S | None``), else None."""
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
        return typ
    if get_origin(typ) in (Union, types.UnionType):
        structs = [a for a in get_args(typ) if isinstance(a, type) and issubclass(a, msgspec.Struct)]
        return structs[0] if len(structs) == 1 else None
    return None


def _value(obj: Any, typ: Any) -> Any:
    if get_origin(typ) is Annotated:  # bounds on a scalar or a container: all or nothing
        return msgspec.convert(obj, type=typ)
    st = _struct(typ)
    if st is not None and isinstance(obj, dict):
        return _fields(obj, st)
    origin, args = get_origin(typ), get_args(typ)
    if origin is dict and isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            try:
                out[msgspec.convert(k, type=args[0])] = lenient(v, args[1])
            except msgspec.ValidationError:
                continue  # one bad value of the mapping, the others kept
        return out
    if origin is list and isinstance(obj, list):
        kept = []
        for v in obj:
            try:
                kept.append(lenient(v, args[0]))
            except msgspec.ValidationError:
                continue
        return kept
    return msgspec.convert(obj, type=typ)


@functools.lru_cache(maxsize=256)
def _struct_fields(st: type[msgspec.Struct]) -> tuple[Any, ...]:
    # msgspec rebuilds the FieldInfo tuple on every call; a bundle reads thousands of collect.json
    return msgspec.structs.fields(st)


def _fields(obj: dict[str, Any], st: type[msgspec.Struct]) -> Any:
    kept: dict[str, Any] = {}
    for f in _struct_fields(st):
        if f.encode_name not in obj:
            if f.required:
                raise msgspec.ValidationError(f"Object missing required field `{f.encode_name}`")
            continue
        try:
            kept[f.name] = lenient(obj[f.encode_name], f.type)
        except msgspec.ValidationError as err:
            if f.required:
                raise msgspec.ValidationError(_at(str(err), f.encode_name)) from err
    return st(**kept)


def _at(msg: str, name: str) -> str:
    """msgspec's message for a field's value, its path put under the field's name."""
    if " - at `$" in msg:
        return msg.replace(" - at `$", f" - at `$.{name}", 1)
    return f"{msg} - at `$.{name}`"


def why(err: Exception, limit: int = 160) -> str:
    """msgspec's message (it names the field: "Expected `int`, got `str` - at `$.seq`"), cut."""
    return str(err)[:limit]
