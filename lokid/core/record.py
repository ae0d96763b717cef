"""Frozen records without the ``dataclasses`` module, for the values on a start's path.

``lokid prestart`` and ``lokid engine`` run between ``systemctl start`` (or a
request's cold start) and the engine's own spawn, each in a new interpreter: what
they import there is paid on every start. ``dataclasses`` imports ``inspect`` (and
``ast``, ``dis``, ``tokenize``…), about 7 ms here, and each class it makes compiles
generated code (about 0.6 ms a class). The records that path reads (the runtime plan,
the attempt mark and verdict, secrets, the state DB's rows) are made here instead:

- ``@record`` on a class with annotated fields gives what ``@dataclass(frozen=True)``
  gives them: ``__init__`` (positional or by name, defaults, ``field(default_factory=…)``),
  ``__eq__`` and ``__hash__`` over the compared fields, ``__repr__``, ``__match_args__``,
  and assignment refused (:class:`FrozenError`, an AttributeError, as
  ``dataclasses.FrozenInstanceError`` is);
- :func:`replace` is ``dataclasses.replace`` for them.

The type checker reads ``@record`` as a frozen dataclass (PEP 681's
``dataclass_transform``); at run time nothing of ``typing`` is imported.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:
    def dataclass_transform(**_kw):  # noqa: ANN001, ANN202 - the checker's only
        return lambda f: f

_MISSING = object()


class FrozenError(AttributeError):
    """An assignment to a field of a record."""


class _Field:
    __slots__ = ("default", "factory", "compare")

    def __init__(self, default: Any, factory: Callable[[], Any] | None, compare: bool):
        self.default, self.factory, self.compare = default, factory, compare


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None,
          compare: bool = True) -> Any:
    """A field's default made anew for each record (``default_factory``), or one left
    out of equality and hashing (``compare=False``), as ``dataclasses.field``."""
    return _Field(default, default_factory, compare)


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    """``cls`` made a frozen record of its annotated fields (in their order)."""
    names = tuple(cls.__dict__.get("__annotations__", {}))
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    compared = []
    for name in names:
        value = cls.__dict__.get(name, _MISSING)
        compare = True
        if isinstance(value, _Field):
            compare = value.compare
            if value.factory is not None:
                factories[name] = value.factory
            value = value.default
        if value is not _MISSING:
            defaults[name] = value
        elif name not in factories and (defaults or factories):
            raise TypeError(f"{cls.__name__}.{name}: a field without a default follows "
                            "one with a default")
        if name in cls.__dict__:
            delattr(cls, name)
        if compare:
            compared.append(name)
    keys = tuple(compared)
    setattr_ = object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__}() takes {len(names)} arguments, "
                            f"{len(args)} given")
        for i, name in enumerate(names):
            if i < len(args):
                if name in kwargs:
                    raise TypeError(f"{cls.__name__}() got two values for {name!r}")
                value = args[i]
            elif name in kwargs:
                value = kwargs.pop(name)
            elif name in factories:
                value = factories[name]()
            elif name in defaults:
                value = defaults[name]
            else:
                raise TypeError(f"{cls.__name__}() is missing {name!r}")
            setattr_(self, name, value)
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected {', '.join(map(repr, kwargs))}")

    def _values(self: Any) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in keys)

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(_values(self) == _values(other))

    def __hash__(self: Any) -> int:
        return hash(_values(self))

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{cls.__qualname__}({inner})"

    def __setattr__(self: Any, name: str, value: Any) -> None:
        raise FrozenError(f"cannot assign to field {name!r}")

    def __delattr__(self: Any, name: str) -> None:
        raise FrozenError(f"cannot delete field {name!r}")

    for method in (__init__, __eq__, __hash__, __repr__, __setattr__, __delattr__):
        method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
        setattr(cls, method.__name__, method)
    setattr(cls, "__match_args__", names)  # noqa: B010 - not a field: the checker knows it
    cls.__record_fields__ = names  # type: ignore[attr-defined]
    return cls


def replace(obj: T, **changes: Any) -> T:
    """A copy of the record ``obj`` with ``changes`` (``dataclasses.replace``, which it
    is for a dataclass)."""
    names = getattr(type(obj), "__record_fields__", None)
    if names is None:
        import dataclasses

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    unknown = set(changes) - set(names)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {', '.join(sorted(unknown))}")
    return type(obj)(**{n: changes[n] if n in changes else getattr(obj, n) for n in names})
