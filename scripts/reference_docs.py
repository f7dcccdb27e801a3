"""The reference pages under docs/reference/, generated from the code so that they cannot drift from it.

    .venv/bin/python -m scripts.reference_docs            write docs/reference/{recipe,settings,cli}.md
    .venv/bin/python -m scripts.reference_docs --check    exit 1, naming each page that differs

- recipe.md: every section and field of the recipe, walked from pydantic's ``model_fields`` of
  ``quantize_serve.recipe.model.Recipe`` down (its dotted key, type, default and ``description=``).
- settings.md: every ``QS_*`` variable, from ``quantize_serve.core.settings.Settings``.
- cli.md: every ``quantize-serve`` subcommand and its options, from ``quantize_serve.cli.build_parser``.

The output is the same on any machine: fields in their definition order, no timestamp, and a default
computed from the host (a path under the project, the running Python) written the same everywhere.
tests/unit/test_reference_docs.py fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ByteSize
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from quantize_serve import cli
from quantize_serve.core import settings as settings_module
from quantize_serve.core.settings import PROJECT_ROOT, Settings
from quantize_serve.recipe.model import Recipe

ROOT = Path(__file__).resolve().parents[1]
PAGES_DIR = Path("docs") / "reference"
COMMAND = ".venv/bin/python -m scripts.reference_docs"
NO_DESCRIPTION = "(no description)"
USAGE_WIDTH = 100  # argparse wraps the usage at the terminal's width otherwise


def header(source: str) -> str:
    return (
        f"<!-- Generated from {source} by `{COMMAND}`; do not edit by hand. "
        "tests/unit/test_reference_docs.py fails when this page is stale. -->\n"
    )


def one_line(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def cell(text: str) -> str:
    """Prose for a page: one line, and outside code spans ``<`` escaped (``<recipe name>`` is no tag)."""
    parts = one_line(text).split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def code(text: str) -> str:
    return f"`{one_line(text)}`"


def docstring(obj: Any) -> str:
    """An object's own docstring (not one inherited from pydantic) as paragraphs, each on one line."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    if not doc:
        return ""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# --------------------------------------------------------------------------------------------
# Types and defaults
# --------------------------------------------------------------------------------------------

CONSTRAINTS: dict[type, tuple[str, str]] = {
    annotated_types.Gt: ("gt", "> {}"),
    annotated_types.Ge: ("ge", ">= {}"),
    annotated_types.Lt: ("lt", "< {}"),
    annotated_types.Le: ("le", "<= {}"),
    annotated_types.MinLen: ("min_length", "length >= {}"),
    annotated_types.MaxLen: ("max_length", "length <= {}"),
}
NAMES = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    Path: "path",
    ByteSize: "byte size",
    Any: "any",
}


def constraints(metadata: list[Any]) -> list[str]:
    out = []
    for m in metadata:
        if type(m) in CONSTRAINTS:
            attr, form = CONSTRAINTS[type(m)]
            out.append(form.format(getattr(m, attr)))
        elif getattr(m, "pattern", None):
            out.append(f"matching {m.pattern}")
    return out


def with_constraints(name: str, metadata: list[Any]) -> str:
    found = constraints(metadata)
    return f"{name} ({', '.join(found)})" if found else name


def type_name(annotation: Any) -> str:
    """A field's type as a recipe author writes it: YAML's null, literals quoted, sections as mapping."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Annotated:
        return with_constraints(type_name(args[0]), list(args[1:]))
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if annotation in NAMES:
        return NAMES[annotation]
    raise TypeError(f"no name for the type {annotation!r}: add it to scripts/reference_docs.py NAMES")


def value(v: Any) -> str:
    if isinstance(v, BaseModel):
        return "its fields' defaults"
    if isinstance(v, Path):
        return host_path(v)
    return code(json.dumps(v))


def host_path(path: Path) -> str:
    """A default path as the same text on every machine."""
    if path == Path(sys.executable):
        return "the Python running quantize-serve (`sys.executable`)"
    if path.is_relative_to(PROJECT_ROOT):
        return code(path.relative_to(PROJECT_ROOT).as_posix()) + " (under the project root)"
    return code(path.as_posix())


def default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return value(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    return value(field.default)


# --------------------------------------------------------------------------------------------
# recipe.md
# --------------------------------------------------------------------------------------------


def section_model(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field's type holds (a section, a list of them, or either or null), and the key's suffix."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    if origin is list and args:
        found = section_model(args[0])
        return (found[0], "[]") if found else None
    if origin in (Union, types.UnionType):
        found = [s for a in args if (s := section_model(a))]
        return found[0] if found else None
    return None


def sections(model: type[BaseModel], key: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted key, model) of the recipe and every section under it, depth first in field order."""
    yield key, model
    for name, field in model.model_fields.items():
        found = section_model(field.annotation)
        if found:
            yield from sections(found[0], f"{key}.{name}{found[1]}".lstrip("."))


def section_heading(key: str) -> str:
    return f"`{key}`" if key else "Top level"


def field_type(field: FieldInfo) -> str:
    """The type with the field's own constraints (``Field(gt=0)``) on its non-null part."""
    args = get_args(field.annotation)
    if field.metadata and get_origin(field.annotation) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return with_constraints(" | ".join(type_name(a) for a in rest), field.metadata) + " | null"
    return with_constraints(type_name(field.annotation), field.metadata)


def recipe_field_row(key: str, name: str, field: FieldInfo) -> str:
    dotted = f"{key}.{name}".lstrip(".")
    found = section_model(field.annotation)
    description = field.description
    shown = code(field_type(field))
    if found:
        where = section_heading(f"{dotted}{found[1]}")
        shown += f", see [{where}](#{slug(where)})"
        description = description or docstring(found[0]).split(". ")[0].split("\n")[0]
    return f"| {code(dotted)} | {shown} | {default(field)} | {cell(description or NO_DESCRIPTION)} |"


def recipe_page() -> str:
    all_sections = list(sections(Recipe))
    fields = sum(len(m.model_fields) for _, m in all_sections)
    described = sum(1 for _, m in all_sections for f in m.model_fields.values() if f.description)
    lines = [
        header("the pydantic models of quantize_serve/recipe/"),
        "# Recipe reference",
        "",
        "Every section and field of a recipe (`quantize_serve/recipe/model.py` and the sections it uses), "
        "in the order they are defined. A recipe is one YAML file; an unknown key is an error. Keys are "
        "dotted (`serve.search.max_boots`); `[]` marks a list whose items are mappings "
        "(`quantization.candidates[].name`). A run's `overrides` parameter takes the same dotted keys, "
        "with an item's index for `[]` (`gates.accuracy.tasks.0.limit`). Types and defaults are written "
        "as YAML reads them (`null`: unset). Rules a validator checks beyond the type (ranges, fields "
        "that exclude each other, rules across sections) are named in the error a recipe that breaks "
        "them gets when it is loaded.",
        "",
        f"{len(all_sections)} sections, {fields} fields, {described} of them with a description in the "
        f"code; a field without one shows {NO_DESCRIPTION}.",
        "",
        "Sections: "
        + ", ".join(f"[{section_heading(k)}](#{slug(section_heading(k))})" for k, _ in all_sections),
    ]
    for key, model in all_sections:
        lines += ["", f"## {section_heading(key)}", ""]
        doc = docstring(model)
        if doc:
            lines += [doc, ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        lines += [recipe_field_row(key, name, field) for name, field in model.model_fields.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# settings.md
# --------------------------------------------------------------------------------------------


def variable(name: str, field: FieldInfo) -> str:
    alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
    return alias or f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def settings_page() -> str:
    lines = [
        header("quantize_serve/core/settings.py (Settings)"),
        "# `QS_*` settings reference",
        "",
        docstring(settings_module),
        "",
        "Each variable is read once per process, in upper or lower case; a boolean takes `true`/`false` "
        "or `1`/`0`. A default under the project is shown relative to the project root. A setting "
        f"without a description shows {NO_DESCRIPTION}.",
        "",
        "| variable | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        kind = field_type(field)
        description = cell(field.description) if field.description else NO_DESCRIPTION
        lines.append(f"| {code(variable(name, field))} | {code(kind)} | {default(field)} | {description} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# cli.md
# --------------------------------------------------------------------------------------------


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def argument_name(action: argparse.Action) -> str:
    if action.option_strings:
        return ", ".join(action.option_strings)
    return action.metavar if isinstance(action.metavar, str) else action.dest


def argument_value(action: argparse.Action) -> str:
    if action.option_strings and action.nargs == 0:
        return "(a flag)"
    if action.choices is not None:
        return code(" | ".join(str(c) for c in action.choices))
    if action.option_strings:
        return code(action.metavar if isinstance(action.metavar, str) else action.dest.upper())
    return {"?": "optional", "+": "one or more", "*": "any number"}.get(str(action.nargs), "required")


def argument_default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS, False) or not action.option_strings:
        return ""
    return code(str(action.default) or '""')


def argument_help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": prog}
    return cell(text) if text else NO_DESCRIPTION


def arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | value | default | description |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        rows.append(
            f"| {code(argument_name(action))} | {argument_value(action)} | {argument_default(action)} "
            f"| {argument_help(action, parser.prog)} |"
        )
    for group in parser._mutually_exclusive_groups:
        names = " or ".join(code(argument_name(a)) for a in group._group_actions)
        rows += ["", f"{'Exactly' if group.required else 'At most'} one of {names}."]
    return rows


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order they were added."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]


def cli_page() -> str:
    parser = cli.build_parser()
    commands = subcommands(parser)
    lines = [
        header("quantize_serve/cli.py (build_parser)"),
        "# `quantize-serve` command line reference",
        "",
        cell(parser.description or ""),
        "",
        "```",
        usage(parser),
        "```",
        "",
        "| command | what |",
        "|---|---|",
        *(
            f"| [{code(f'{parser.prog} {n}')}](#{slug(f'{parser.prog} {n}')}) | {cell(h)} |"
            for n, h, _ in commands
        ),
        "",
        *arguments(parser),
    ]
    for name, help_text, sub in commands:
        lines += ["", f"## {parser.prog} {name}", "", f"{cell(help_text)}." if help_text else "", ""]
        if sub.description:
            lines += [cell(sub.description), ""]
        lines += ["```", usage(sub), "```", "", *arguments(sub)]
    return "\n".join(line for i, line in enumerate(lines) if line or lines[i - 1]) + "\n"


# --------------------------------------------------------------------------------------------
# Writing and checking
# --------------------------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "recipe.md": recipe_page,
    "settings.md": settings_page,
    "cli.md": cli_page,
}


def pages() -> dict[Path, str]:
    """Each page's path relative to the project root, and its text."""
    return {PAGES_DIR / name: make() for name, make in PAGES.items()}


def stale(root: Path = ROOT) -> list[str]:
    """The pages whose committed text differs from what the code generates (missing ones included)."""
    out = []
    for path, text in pages().items():
        target = root / path
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            out.append(path.as_posix())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 when stale")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for path in found:
            print(f"{path} is stale: run {COMMAND}")
        return 1 if found else 0
    for path, text in pages().items():
        (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / path).write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
