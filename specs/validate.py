"""Turn pydantic validation errors into one-paragraph SpecErrors that point at file:line."""

from __future__ import annotations

import difflib
import re
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel
from pydantic_core import ErrorDetails, PydanticUndefined

from .errors import SpecError, SpecErrors, dotted
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
    """Show a value the way it was written in YAML (null/true/false, not None/True/False)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_default(model: type[BaseModel], loc: tuple) -> Any:
    """The default of the field at `loc`, or pydantic's PydanticUndefined when it has none."""
    owner = _model_at(model, loc[:-1]) if loc else None
    if owner is None or not isinstance(loc[-1], str) or loc[-1] not in owner.model_fields:
        return PydanticUndefined
    info = owner.model_fields[loc[-1]]
    if info.default_factory is not None:
        return PydanticUndefined
    return info.default


def _field_upper_bound(model: type[BaseModel], loc: tuple) -> Any:
    """The field's `le` bound, or None (said when a number is too large even to convert)."""
    owner = _model_at(model, loc[:-1]) if loc else None
    if owner is None or not isinstance(loc[-1], str) or loc[-1] not in owner.model_fields:
        return None
    return next((m.le for m in owner.model_fields[loc[-1]].metadata if getattr(m, "le", None) is not None), None)


def _num(x: Any) -> str:
    """A bound as users write it: 0 rather than 0.0."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# What each kind of pydantic error means, said as guidance: "must be ...".
_EXPECTED = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text (put it in quotes if it looks like a number)",
    "list_type": "must be a list, e.g. [1, 2, 3]",
    "model_type": "must be a mapping of keys to values",
    "dict_type": "must be a mapping of keys to values",
    "model_attributes_type": "must be a mapping of keys to values",
}


def _guidance(kind: str, err: dict) -> str | None:
    """Plain-words requirement for the common error kinds; None for the rest."""
    ctx = err.get("ctx") or {}
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind == "greater_than_equal":
        return f"must be at least {_num(ctx['ge'])}"
    if kind == "greater_than":
        return f"must be greater than {_num(ctx['gt'])}"
    if kind == "less_than_equal":
        return f"must be at most {_num(ctx['le'])}"
    if kind == "less_than":
        return f"must be less than {_num(ctx['lt'])}"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must have at least {_plural(n, 'character')}"
    if kind == "string_too_long":
        return f"must have at most {_plural(ctx.get('max_length'), 'character')}"
    if kind == "too_short":
        return f"must list at least {_plural(ctx.get('min_length'), 'item')}"
    if kind == "too_long":
        return f"must list at most {_plural(ctx.get('max_length'), 'item')}"
    if kind == "literal_error":
        if ctx.get("expected"):
            return f"must be {ctx['expected']}"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx.get('pattern')}"
    return None


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
    if kind == "value_error":
        msg = err["msg"]
        msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
        return msg if msg.endswith(".") else msg + "."
    value = err.get("input", PydanticUndefined)
    if kind == "int_parsing_size":  # e.g. 1.0e+26 for an int: refused, never truncated
        bound = _field_upper_bound(model, loc)
        kind, err = ("less_than_equal", {**err, "ctx": {"le": bound}}) if bound is not None else ("int_type", err)
    got = f", got {_describe_input(value)}" if value is not PydanticUndefined else ""
    need = _guidance(kind, err)
    if need is None:
        # Anything not mapped above: keep pydantic's words, minus its "Input should be".
        msg = err["msg"].replace("Input should be", "must be")
        need = msg[0].lower() + msg[1:] if msg else kind
    hint = ""
    if kind == "literal_error" and isinstance(value, str):
        choices = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        guess = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
        hint = f" Did you mean '{guess[0]}'?" if guess else ""
    if value is None:
        default = _field_default(model, loc)
        if default is not PydanticUndefined:
            hint += f" Leave the key out to use the default ({_describe_input(default)})."
    return f"{need}{got}.{hint}"


def _bool_as_number(model: type[BaseModel], data: Any) -> ErrorDetails | None:
    """pydantic reads YAML true/false as 1/0 for number fields; report that instead of accepting it.

    (`workers: yes` is a boolean in YAML and would silently mean 1 worker.)
    """
    try:
        model.model_validate(data, strict=True)
    except pydantic.ValidationError as exc:
        for err in exc.errors(include_url=False):
            if err["type"] in ("int_type", "float_type") and isinstance(err.get("input"), bool):
                return err
    return None


def _clean_loc(loc: tuple) -> tuple:
    # pydantic adds tags for union members and validators; they mean nothing to users.
    return tuple(
        p for p in loc
        if not (isinstance(p, str) and (p.startswith("function-") or p in ("str", "int", "float", "bool", "list[int]")))
    )


def _meant(err: ErrorDetails, model: type[BaseModel]) -> tuple | None:
    """The field an unknown key was probably meant to be (its did-you-mean), as a location."""
    loc = _clean_loc(tuple(err["loc"]))
    owner = _model_at(model, loc[:-1])
    guess = difflib.get_close_matches(str(loc[-1]), sorted(owner.model_fields), n=1, cutoff=0.5) if owner else []
    return loc[:-1] + (guess[0],) if guess else None


def _problem(err: ErrorDetails, model: type[BaseModel], source: YamlSource, prefix: tuple) -> SpecError:
    clean = _clean_loc(tuple(err["loc"]))
    loc = prefix + clean
    message = _message({**err, "loc": clean}, model)
    return SpecError(message, where=source.where(loc), field=dotted(loc) or None)


def validate(model: type[M], source: YamlSource, data: Any = None, prefix: tuple = ()) -> M:
    """Validate `data` (default: the whole file) against `model`; every problem found is raised, each its own
    paragraph (SpecErrors when there are several)."""
    data = source.data if data is None else data
    try:
        result = model.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        # An unknown key is usually a typo, and often the cause of the other errors
        # (`pipline:` also makes `pipeline` missing): report it first.
        errors.sort(key=lambda e: e["type"] != "extra_forbidden")
        meant = {_meant(e, model) for e in errors if e["type"] == "extra_forbidden"}
        # `pipline:` said with its "did you mean 'pipeline'?" is the whole story: not "pipeline is required" too
        errors = [e for e in errors if not (e["type"] == "missing" and _clean_loc(tuple(e["loc"])) in meant)]
        problems = [_problem(e, model, source, prefix) for e in errors]
        raise (problems[0] if len(problems) == 1 else SpecErrors(problems)) from None
    bool_err = _bool_as_number(model, data)
    if bool_err is not None:
        raise _problem(bool_err, model, source, prefix) from None
    return result
