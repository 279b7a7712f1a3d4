"""Turn pydantic validation errors into one-paragraph SpecErrors that point at file:line."""

from __future__ import annotations

import difflib
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel

from .errors import SpecError, dotted
from .yamlsource import YamlSource

M = TypeVar("M", bound=BaseModel)


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """Follow `loc` through nested models to find the model that owns the last key."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        current = _first_model(fields[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _describe_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(err: dict, model: type[BaseModel]) -> str:
    kind = err["type"]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    if kind == "extra_forbidden":
        key = loc[-1]
        owner = _model_at(model, loc[:-1])
        valid = sorted(owner.model_fields) if owner else []
        guess = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
        hint = f" Did you mean '{guess[0]}'?" if guess else ""
        listed = f" Valid keys here: {', '.join(valid)}." if valid else ""
        return f"unknown key '{key}'.{hint}{listed}"
    if kind == "missing":
        return "this field is required but was not given."
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    elif "input" in err and kind not in ("model_type", "dict_type"):
        msg = f"{msg}, got {_describe_input(err['input'])}"
    elif kind in ("model_type", "dict_type"):
        msg = f"expected a mapping of keys to values, got {_describe_input(err.get('input'))}"
    return msg[0].upper() + msg[1:] + ("" if msg.endswith(".") else ".") if msg else kind


def _clean_loc(loc: tuple) -> tuple:
    # pydantic adds tags for union members and validators; they mean nothing to users.
    return tuple(
        p for p in loc
        if not (isinstance(p, str) and (p.startswith("function-") or p in ("str", "int", "float", "bool", "list[int]")))
    )


def validate(model: type[M], source: YamlSource, data: Any = None, prefix: tuple = ()) -> M:
    """Validate `data` (default: the whole file) against `model`, raising the first error as a SpecError."""
    data = source.data if data is None else data
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        loc = prefix + _clean_loc(tuple(err["loc"]))
        message = _message({**err, "loc": _clean_loc(tuple(err["loc"]))}, model)
        more = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''} after this one.)" if len(errors) > 1 else ""
        raise SpecError(message + more, where=source.where(loc), field=dotted(loc) or None) from None
