"""Whether a request's `extra` value fits the type its pipeline argument is annotated with.

A request's extras reach the pipeline's `__call__` as keyword arguments, and a JSON value of the
wrong type used to fail inside it with a Python error, which the job reported as INTERNAL
(`timesteps=false`, `sigmas=1`, `height={"scale": 2}`, `ip_adapter_image="pt"`: an image
argument, which no JSON value can be). `mismatch` reads the annotation instead and says what the
argument takes; `args.check_arguments` refuses the value before the call.

The values are what `google.protobuf.Struct` carries, as `args._plain_number` hands them on: None,
bool, int (an integral number), float, str, list and dict. The rules: a float takes an int, an
int does not take a bool; a list or tuple annotation takes a list (`tuple[int, int]` one of two,
`tuple[int]` any number, as diffusers means it), a mapping a dict; a default of None makes the
argument Optional (diffusers writes `timesteps: List[int] = None`); any other class takes only
its own instances, which a JSON value never is (PIL images, arrays, tensors, callables). An
argument without an annotation, or with one the worker cannot read (text naming a type its
module does not import, a TypeVar, a Protocol), takes anything, as before.
"""

from __future__ import annotations

import collections.abc as abc
import enum
import functools
import inspect
import types
import typing
from typing import Any

# What a type's description is cut to in an error (diffusers' image input spells out six types).
MAX_DESCRIPTION_CHARS = 160
_UNIONS = (typing.Union, types.UnionType)
_SKIPPED = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@functools.lru_cache(maxsize=256)
def parameter_types(function: Any) -> dict[str, tuple[Any, bool]]:
    """The annotation of each parameter of `function` that has one the worker can read, and
    whether its default is None (which the argument then takes, whatever its annotation says).

    Text (a module with `from __future__ import annotations`) is evaluated in the function's
    module, one parameter at a time, so one unreadable annotation leaves the others checked.
    """
    found: dict[str, tuple[Any, bool]] = {}
    # The module of the function itself, not of a decorator's wrapper (diffusers' `torch.no_grad()`).
    names = getattr(inspect.unwrap(function), "__globals__", {})
    for parameter in inspect.signature(function).parameters.values():
        annotation = parameter.annotation
        if parameter.kind in _SKIPPED or annotation is inspect.Parameter.empty:
            continue
        if isinstance(annotation, str):
            try:
                # What typing.get_type_hints does with the pipeline's own source text.
                annotation = eval(annotation, dict(names))
            except Exception:  # a name imported only under TYPE_CHECKING, or not at all
                continue
        found[parameter.name] = (annotation, parameter.default is None)
    return found


def mismatch(function: Any, name: str, value: Any) -> str | None:
    """None when `value` fits the annotation of `function`'s parameter `name` (or it has none
    the worker can read); else what the parameter takes, for the error."""
    known = parameter_types(function).get(name)
    if known is None:
        return None
    annotation, optional = known
    if (value is None and optional) or fits(value, annotation):
        return None
    text = describe(annotation) + (" | None" if optional and not fits(None, annotation) else "")
    return text if len(text) <= MAX_DESCRIPTION_CHARS else text[: MAX_DESCRIPTION_CHARS - 3] + "..."


def fits(value: Any, annotation: Any) -> bool:
    """Whether a JSON `value` is of the type `annotation`; True for what the rules do not know."""
    if annotation is Any or annotation is object:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in _UNIONS:
        return any(fits(value, member) for member in args)
    if origin is typing.Literal:
        return any(type(value) is type(choice) and value == choice for choice in args)
    if origin is typing.Annotated:
        return fits(value, args[0])
    if origin is not None:
        return _fits_generic(value, origin, args)
    if isinstance(annotation, type):
        return _fits_class(value, annotation)
    return True  # a TypeVar, a NewType, a string forward reference: not known


def _fits_class(value: Any, cls: type) -> bool:
    if cls is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if cls is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if cls is tuple:
        return isinstance(value, list | tuple)
    if issubclass(cls, enum.Enum):  # a str enum compares equal to its value
        return any(value == member.value for member in cls)
    try:
        return isinstance(value, cls)
    except TypeError:  # a Protocol that is not runtime-checkable
        return True


def _fits_generic(value: Any, origin: Any, args: tuple[Any, ...]) -> bool:
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return False
        if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
            # diffusers writes `tuple[int]` for any number of ints (Flux 2's `text_encoder_out_layers`).
            return all(fits(item, args[0]) for item in value)
        if args:
            return len(value) == len(args) and all(map(fits, value, args))
        return True
    if origin is abc.Callable or origin is type:
        return False  # no JSON value is a function or a class
    if not isinstance(origin, type):
        return True
    if issubclass(origin, abc.Mapping):
        key, item = args if len(args) == 2 else (Any, Any)
        return isinstance(value, dict) and all(fits(k, key) and fits(v, item) for k, v in value.items())
    if issubclass(origin, abc.Iterable) and not issubclass(origin, str | bytes):
        item = args[0] if args else Any
        return isinstance(value, list | tuple) and all(fits(v, item) for v in value)
    return _fits_class(value, origin)


def describe(annotation: Any) -> str:
    """`annotation` as a reader would write it: `list[int] | None`, `PIL.Image.Image`."""
    if annotation is None or annotation is type(None):
        return "None"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in _UNIONS:
        return " | ".join(describe(member) for member in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in args)
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else describe(a) for a in args if not isinstance(a, list))
        return f"{describe(origin)}[{inner}]"
    if isinstance(annotation, type):
        if annotation.__module__ in ("builtins", "collections.abc", "typing"):
            return annotation.__qualname__
        return f"{annotation.__module__}.{annotation.__qualname__}"
    return str(annotation).replace("typing.", "")
