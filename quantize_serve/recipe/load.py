"""Loading a recipe: YAML (a duplicate key is an error), overrides, pydantic's errors translated into
ours (field, value, fix, "did you mean")."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from quantize_serve.core.errors import RecipeError, RecipeErrors
from quantize_serve.recipe.model import Recipe
from quantize_serve.recipe.section import RECIPE_SOURCE

FIXES = {
    "extra_forbidden": "remove the key or check its spelling against the recipe reference in README.md",
    "literal_error": "use one of the allowed values",
    "missing": "add the field (see the recipe reference in README.md)",
    "int_parsing": "use a whole number",
    "int_from_float": "use a whole number",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
    "string_type": "use text (quote it if YAML reads it as something else)",
    "list_type": "write a list, e.g. [a, b]",
    "dict_type": "write a mapping: keys indented under it",
    "model_type": "write a mapping: keys indented under it",
    "model_attributes_type": "write a mapping: keys indented under it",
    "string_pattern_mismatch": "use lowercase letters, digits and dashes",
    "byte_size": "write a size such as 8MiB or 80GB",
}


BOUND_FIXES = {
    "greater_than": "above {gt}",
    "greater_than_equal": "of at least {ge}",
    "less_than": "below {lt}",
    "less_than_equal": "of at most {le}",
}


def parse_recipe(data: Any, *, source: str = RECIPE_SOURCE, base_dir: Path | None = None) -> Recipe:
    """Validate a mapping into a Recipe, translating pydantic's errors into ours."""
    if data is None:
        raise RecipeError(
            source,
            "<file>",
            "",
            "the recipe is empty (or holds only comments)",
            "start from a shipped recipe, e.g. recipes/tiny-llama-awq.yaml",
        )
    if not isinstance(data, dict):
        raise RecipeError(
            source,
            "<top level>",
            type(data).__name__,
            "a recipe is a mapping",
            "start the file with keys such as name:, model:, calibration:",
        )
    if base_dir is not None:
        data = {**data, "base_dir": str(base_dir)}
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeErrors(translate_errors(source, exc.errors())) from None


def apply_overrides(data: Any, overrides: dict[str, Any], *, source: str) -> dict[str, Any]:
    """A copy of the recipe mapping with each dotted key set to its value (``serve.max_num_seqs``,
    ``gates.accuracy.tasks``, ``gates.accuracy.tasks.0.limit``): a deployment's parameters adapt
    a shipped recipe without a copy of the file. The result is validated like the file itself, so a
    misspelled key gets the same error, did-you-mean included."""
    import copy

    data = copy.deepcopy(data) if isinstance(data, dict) else {}
    for dotted, value in overrides.items():
        node: Any = data
        keys = str(dotted).split(".")
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                index: Any = int(key)
            elif isinstance(node, dict) and key:
                index = key
            else:
                where = ".".join(keys[:i]) or "<top level>"
                raise RecipeError(
                    source,
                    f"overrides.{dotted}",
                    value,
                    f"{where} has no entry {key!r} to set",
                    "name a recipe field with dots (serve.max_num_seqs), list items by index "
                    "(gates.accuracy.tasks.0.limit)",
                )
            if last:
                node[index] = value
            else:
                if isinstance(node, dict) and not isinstance(node.get(index), (dict, list)):
                    node[index] = {}
                node = node[index]
    return data


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate a recipe file (with ``overrides`` applied, see apply_overrides). Fails on
    the first read, before anything heavy."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(
            str(path),
            "<file>",
            str(path),
            "no such recipe file",
            "pass the path of a YAML recipe, e.g. recipes/tiny-llama-awq.yaml",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecipeError(
            str(path),
            "<file>",
            str(path),
            "not a UTF-8 text file",
            "pass the path of a YAML recipe, e.g. recipes/tiny-llama-awq.yaml",
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except _DuplicateKey as exc:
        raise duplicate_key_error(str(path), text, exc) from None
    except yaml.MarkedYAMLError as exc:
        raise yaml_error(str(path), text, exc) from None
    except yaml.YAMLError as exc:
        raise RecipeError(
            str(path),
            "<yaml>",
            str(exc).splitlines()[0],
            "not valid YAML",
            "fix the YAML syntax at the line shown",
        ) from None
    if overrides:
        data = apply_overrides(data, overrides, source=str(path))
    return parse_recipe(data, source=str(path), base_dir=path.resolve().parent)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: yaml.Mark, second: yaml.Mark) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key written twice in one mapping is an error: plain YAML
    keeps the last one silently, so a recipe with ``name:`` twice would run with a setting its
    author may not have meant."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise _DuplicateKey(key, seen[key], key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def duplicate_key_error(source: str, text: str, exc: _DuplicateKey) -> RecipeError:
    """Both lines of a key written twice in one mapping."""
    lines = text.splitlines()
    first, second = exc.first.line, exc.second.line
    return RecipeError(
        source,
        str(exc.key),
        exc.key,
        f"the key is written twice in one mapping: line {first + 1} "
        f"({lines[first].strip()!r}) and line {second + 1} ({lines[second].strip()!r})",
        f"keep one of the two lines ({first + 1} or {second + 1}); YAML would silently use the last",
    )


def yaml_error(source: str, text: str, exc: yaml.MarkedYAMLError) -> RecipeError:
    """The line, the column and the offending line of a YAML syntax error."""
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return RecipeError(
            source, "<yaml>", "", f"not valid YAML: {exc.problem or exc}", "fix the YAML syntax"
        )
    lines = text.splitlines()
    offending = lines[mark.line] if mark.line < len(lines) else ""
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    context = ""
    if exc.context and exc.context_mark is not None and exc.context_mark.line != mark.line:
        context = f" ({exc.context} at line {exc.context_mark.line + 1})"
    return RecipeError(
        source,
        "<yaml>",
        offending,
        f"not valid YAML at {where}: {exc.problem}{context}",
        f"fix {where}: indent with spaces (not tabs) so nested keys line up, end every key "
        "with ':', close every quote and bracket",
    )


def translate_errors(source: str, errors: list[dict[str, Any]]) -> list[RecipeError]:
    """pydantic's errors as ours: field, value, problem, fix.

    An unknown key gets "did you mean ...?" (difflib against the keys its section allows), and the
    "Field required" of the key it stands for is dropped: a misspelled section is one mistake, not
    two. Errors raised as RecipeError(s) by our validators keep their own field and fix.
    """
    meant: dict[tuple[Any, ...], str | None] = {}
    for e in errors:
        if e["type"] == "extra_forbidden" and e["loc"]:
            *parent, key = e["loc"]
            guess = _closest(str(key), _allowed_keys(tuple(parent)))
            meant[tuple(e["loc"])] = guess
    stands_for = {(*loc[:-1], guess) for loc, guess in meant.items() if guess is not None}
    out: list[RecipeError] = []
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in stands_for:
            continue
        if e["type"] == "extra_forbidden" and loc in meant:
            out.append(_unknown_key(source, e, meant[loc]))
            continue
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, RecipeErrors):
            out.extend(err.with_source(source) for err in cause.errors)
        elif isinstance(cause, RecipeError):
            out.append(cause.with_source(source))
        else:
            out.append(_translate(source, e))
    return out


def _translate(source: str, err: dict[str, Any]) -> RecipeError:
    field = ".".join(str(p) for p in err["loc"]) or "<top level>"
    kind, ctx = err["type"], err.get("ctx") or {}
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = err.get("input")
    fix = FIXES.get(kind, "see the problem above")
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        fix = f"use one of {ctx.get('expected') or msg.split('Input should be ', 1)[-1]}"
        guess = _closest(str(value), choices) if isinstance(value, str) else None
        if guess:
            msg += f"; did you mean {guess!r}?"
    elif kind in BOUND_FIXES:
        fix = "use a value " + BOUND_FIXES[kind].format(**ctx)
    elif kind in ("value_error", "assertion_error"):
        msg, fix = _split_fix(msg)
    if isinstance(value, dict):
        value = "{...}"
    return RecipeError(source, field, value, msg, fix)


def _unknown_key(source: str, err: dict[str, Any], guess: str | None) -> RecipeError:
    *parent, key = err["loc"]
    field = ".".join(str(p) for p in err["loc"])
    value = "{...}" if isinstance(err.get("input"), dict) else err.get("input")
    if guess is not None:
        return RecipeError(
            source, field, value, f"unknown key; did you mean {guess!r}?", f"rename {str(key)!r} to {guess!r}"
        )
    allowed = _allowed_keys(tuple(parent))
    where = ".".join(str(p) for p in parent) or "the top level"
    return RecipeError(
        source,
        field,
        value,
        "unknown key",
        f"remove it; {where} allows: {', '.join(allowed)}" if allowed else FIXES["extra_forbidden"],
    )


def _split_fix(message: str) -> tuple[str, str]:
    """A validator's message as (problem, fix): "<problem>. Fix: <fix>", else the last "; <fix>"
    outside parentheses, else the whole message (which then says what to do itself)."""
    if " Fix: " in message:
        problem, fix = message.split(" Fix: ", 1)
        return problem.rstrip(". "), fix
    depth, cut = 0, -1
    for i, ch in enumerate(message):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and message.startswith("; ", i):
            cut = i
    if cut > 0:
        return message[:cut], message[cut + 2 :]
    return message, "see the problem above"


def _closest(word: str, choices: list[str]) -> str | None:
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not found:  # a different case is the same word to a reader ("Quantization", "AWQ")
        found = [c for c in choices if c.lower() == word.lower()]
    return found[0] if found else None


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the recipe allows at ``loc`` (a pydantic error location, list indexes included)."""
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue  # an item of a list of sections: same section type
        info = model.model_fields.get(str(part))
        model = _section_type(info.annotation) if info is not None else None
    if model is None:
        return []
    return [k for k in model.model_fields if k != "base_dir"]


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _section_type(arg)
        if found is not None:
            return found
    return None
