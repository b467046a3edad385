"""A drafter's knobs: the keyword arguments of its constructor that `drafter:` in conf/method/<m>.yaml sets.

Which knobs a drafter has, and their types, come from its __init__ signature; the values each knob accepts from its
class's `knob_rules` (knob -> rule). Both the run's entry (bench/validate.py, before anything loads) and the
constructor (check_knobs) check them here, so their messages are the same line: `method.drafter.<knob>=<value>:
must ...`. A rule takes the value and every knob (defaults filled in, for rules that relate two knobs) and returns
what the value must be, or None when it is fine. A drafter whose dict knob holds another drafter's knobs (SAM-Decoding's
`recycling`) names that class in `nested_knobs`, and its knobs are checked the same way.
"""
from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from bench.errors import ConfigError

Rule = Callable[[Any, dict], str | None]
PREFIX = "method.drafter"  # where a run's config holds the knobs
SUPPLIED = frozenset({"self", "target", "tokenizer", "sampling"})  # what the engine passes: not knobs
INJECTED = frozenset({"head", "heads", "vocab", "draft_model"})  # objects tests pass in place of a checkpoint
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
               tuple: "a list", dict: "a mapping", type(None): "null"}


def at_least(low: int) -> Rule:
    return lambda value, knobs: None if value >= low else f"must be >= {low}"


def null_or(rule: Rule) -> Rule:
    """`rule`, with null also accepted (a knob whose null means "the default")."""
    return lambda value, knobs: None if value is None else rule(value, knobs)


def one_of(*allowed: str) -> Rule:
    return lambda value, knobs: None if value in allowed else f"must be one of {', '.join(allowed)}"


def shown(value) -> str:
    """A value as the command line writes it: true, null, 3, [0, 1]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def knob_types(cls: type) -> dict[str, Any]:
    """Each knob of `cls` -> its annotation (Any where it has none or it does not resolve)."""
    parameters = inspect.signature(cls.__init__).parameters
    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError):  # an annotation naming what only a type checker imports
        hints = {}
    return {name: hints.get(name, Any) for name, parameter in parameters.items()
            if name not in SUPPLIED | INJECTED and parameter.kind not in (parameter.VAR_POSITIONAL,
                                                                           parameter.VAR_KEYWORD)}


def fits(value, hint) -> bool:
    """Whether a config value (YAML scalars, lists, mappings) is of the annotated type; other types are not judged."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, member) for member in typing.get_args(hint))
    if origin in (list, tuple):
        members = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return isinstance(value, (list, tuple)) and (not members or all(fits(v, members[0]) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str, list, tuple, type(None)):
        return isinstance(value, hint)
    return True


def describe(hint) -> str:
    """What a value of the annotated type is, in words: `an integer or null`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe(member) for member in typing.get_args(hint)))
    return _TYPE_NAMES.get(origin or hint, "a value")


def knob_problems(cls: type, knobs: dict, prefix: str = PREFIX) -> list[str]:
    """One line per knob in `knobs` that `cls` lacks, whose value is not of its type, or that its rule refuses."""
    types_ = knob_types(cls)
    unknown = [name for name in knobs if name not in types_]
    if unknown:
        return [f"{prefix}.{name}={shown(knobs[name])}: {cls.__name__} has no such knob; its knobs: {', '.join(types_)}"
                for name in unknown]
    problems = [f"{prefix}.{name}={shown(value)}: must be {describe(types_[name])}" for name, value in knobs.items()
                if not fits(value, types_[name])]
    if problems:
        return problems
    defaults = {name: parameter.default for name, parameter in inspect.signature(cls.__init__).parameters.items()}
    every = {**defaults, **knobs}
    for name, value in knobs.items():
        nested = getattr(cls, "nested_knobs", {}).get(name)
        if nested is not None and value is not None:
            problems += knob_problems(nested, value, f"{prefix}.{name}")
        rule = getattr(cls, "knob_rules", {}).get(name)
        said = rule(value, every) if rule is not None else None
        problems += [f"{prefix}.{name}={shown(value)}: {said}"] if said else []
    return problems


def check_knobs(cls: type, **knobs) -> None:
    """A drafter constructor's check of its knobs: ConfigError (a ValueError) with knob_problems' lines."""
    problems = knob_problems(cls, knobs)
    if problems:
        raise ConfigError("\n".join(problems))
