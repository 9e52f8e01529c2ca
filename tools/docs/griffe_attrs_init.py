"""Griffe extension for the documentation site: the ``__init__`` that attrs generates.

epochguard's value types are attrs classes (``@attrs.frozen``, ``@attrs.define``); their
constructor exists only at run time, so static analysis shows no signature for them. This
builds it from the class body as attrs does: annotated attributes in order (``ClassVar``
and properties are not fields), ``attrs.field(default=..., factory=..., kw_only=...,
init=False, alias=...)``, a private name's leading underscore dropped, ``kw_only=True`` on the
decorator, fields of attrs base classes first. Nothing is imported.
"""

from __future__ import annotations

from typing import Any

import griffe

DECORATORS = {
    "attrs.define",
    "attrs.frozen",
    "attrs.mutable",
    "attr.define",
    "attr.frozen",
    "attr.mutable",
    "attr.s",
    "attr.attrs",
}
FIELD_CALLS = {"attrs.field", "attr.field", "attr.ib", "attr.attrib"}


class AttrsInit(griffe.Extension):
    """Give every attrs class without its own ``__init__`` the one attrs generates."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for cls in _classes(pkg):
            if _decorator(cls) is not None and "__init__" not in cls.members:
                parameters = [
                    griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)
                ]
                parameters += _parameters(cls)
                init = griffe.Function(
                    "__init__",
                    parameters=griffe.Parameters(*parameters),
                    returns="None",
                    lineno=cls.lineno,
                    endlineno=cls.lineno,
                )
                cls.set_member("__init__", init)
                cls.labels.add("attrs")


def _classes(obj: griffe.Object) -> list[griffe.Class]:
    found = [obj] if isinstance(obj, griffe.Class) else []
    for member in obj.members.values():
        if not member.is_alias and (member.is_class or member.is_module):
            found.extend(_classes(member))  # type: ignore[arg-type]
    return found


def _decorator(cls: griffe.Class) -> griffe.Expr | str | None:
    for decorator in cls.decorators:
        value = decorator.value
        path = value.function.canonical_path if isinstance(value, griffe.ExprCall) else None
        if path is None and isinstance(value, griffe.Expr):
            path = value.canonical_path
        if path in DECORATORS:
            return value
    return None


def _call_args(value: Any) -> dict[str, Any]:
    if isinstance(value, griffe.ExprCall):
        return {
            arg.name: arg.value for arg in value.arguments if isinstance(arg, griffe.ExprKeyword)
        }
    return {}


def _parameters(cls: griffe.Class) -> list[griffe.Parameter]:
    fields: dict[str, griffe.Parameter] = {}
    try:
        bases = list(reversed(cls.mro()))
    except ValueError:
        bases = []
    for owner in [*bases, cls]:
        if isinstance(owner, griffe.Class) and _decorator(owner) is not None:
            for param in _own_fields(owner):
                fields.pop(param.name, None)
                fields[param.name] = param
    ordered = list(fields.values())
    kw_only = griffe.ParameterKind.keyword_only
    return [p for p in ordered if p.kind is not kw_only] + [p for p in ordered if p.kind is kw_only]


def _own_fields(cls: griffe.Class) -> list[griffe.Parameter]:
    class_kw_only = str(_call_args(_decorator(cls)).get("kw_only")) == "True"
    out = []
    for member in cls.members.values():
        if not isinstance(member, griffe.Attribute) or member.annotation is None:
            continue
        labels = member.labels
        if "property" in labels or (
            "class-attribute" in labels and "instance-attribute" not in labels
        ):
            continue  # ClassVar, or not a field
        if str(member.annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = member.value
        args: dict[str, Any] = {}
        default: Any = value
        if isinstance(value, griffe.ExprCall) and value.function.canonical_path in FIELD_CALLS:
            args = _call_args(value)
            if str(args.get("init")) == "False":
                continue
            if "default" in args:
                default = args["default"]
            elif "factory" in args:
                default = griffe.ExprCall(function=args["factory"], arguments=[])
            else:
                default = None
        name = str(args["alias"]).strip("'\"") if "alias" in args else member.name.lstrip("_")
        kw_only = class_kw_only or str(args.get("kw_only")) == "True"
        out.append(
            griffe.Parameter(
                name,
                annotation=member.annotation,
                kind=griffe.ParameterKind.keyword_only
                if kw_only
                else griffe.ParameterKind.positional_or_keyword,
                default=default,
                docstring=member.docstring,
            )
        )
    return out
