"""Inline task templates as data: a sandboxed subset of Jinja that can read a row and nothing else.

An inline task (`steps.evaluation.eval_tasks.inline_task`) turns each row of its data into a prompt, its
choices and its target with three Jinja templates. lm-eval renders templates with a plain
`jinja2.Environment`, in which `{{ lipsum.__globals__['os'].system('...') }}` runs a shell
command; a shared manifest is data anyone may have edited, so its templates must not be able to
run code. Drydock never hands lm-eval a template string: it compiles each template here and
gives lm-eval the compiled template as a callable (which lm-eval calls instead of rendering).

What a template may use (checked when the step is declared or rebuilt from a manifest, so a bad
template is one error naming the step and field before anything runs):

  - the row's fields (`{{ question }}`, `{{ choices.text }}`, `{{ options[0] }}`), constants,
    arithmetic, comparisons, `if`/`for`/`set`, slices and method calls the sandbox allows
    (`{{ query.split('\\n')[0] }}`, `{{ 'ABCD'.index(answer) }}`);
  - the filters in `FILTERS` and Jinja's tests; `range` is the only global.

What it may not: any name or attribute that starts with `_` (the way out of every Jinja sandbox
escape), `include`/`import`/`extends`/macros/call blocks, other filters. Rendering happens in
`jinja2.sandbox.ImmutableSandboxedEnvironment`, which also refuses unsafe attributes and calls at
run time and cannot mutate the row, so the check above is one of two locks, not the only one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["FILTERS", "TEMPLATE_FIELDS", "TaskTemplate", "TemplateError", "compile_template"]

TEMPLATE_FIELDS = ("doc_to_text", "doc_to_choice", "doc_to_target")
"""The fields of an inline task that are templates."""

FILTERS = frozenset(
    {
        "abs", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "first",
        "float", "format", "indent", "int", "items", "join", "last", "length", "list", "lower",
        "map", "max", "min", "regex_replace", "reject", "rejectattr", "replace", "reverse",
        "round", "select", "selectattr", "slice", "sort", "string", "sum", "title", "tojson",
        "trim", "truncate", "unique", "upper", "wordcount", "wordwrap",
    }
)  # fmt: skip
"""Filters a template may use: Jinja's text and list filters and lm-eval's `regex_replace`;
not `attr` (attribute access by a computed name), `random`, or the HTML ones."""

_FORBIDDEN = (
    nodes.Extends,
    nodes.Include,
    nodes.Import,
    nodes.FromImport,
    nodes.Macro,
    nodes.CallBlock,
    nodes.ExprStmt,
    nodes.EnvironmentAttribute,
    nodes.ExtensionAttribute,
    nodes.ImportedName,
    nodes.InternalName,
    nodes.ContextReference,
    nodes.DerivedContextReference,
    nodes.EvalContextModifier,
    nodes.ScopedEvalContextModifier,
)
_WHAT = {
    nodes.Extends: "extends",
    nodes.Include: "include",
    nodes.Import: "import",
    nodes.FromImport: "import",
    nodes.Macro: "macro",
    nodes.CallBlock: "call block",
}


class TemplateError(ValueError):
    """A template outside the allowed subset, or one Jinja cannot parse."""


def _regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    """lm-eval's `regex_replace` filter (`re.sub`), which its registry templates use."""
    return re.sub(pattern, repl, string, count=count)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        loader=None, undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    env.filters = {name: fn for name, fn in env.filters.items() if name in FILTERS}
    env.filters["regex_replace"] = _regex_replace
    # lipsum, cycler, joiner, namespace and dict are not needed to format a row: only range stays.
    env.globals = {"range": env.globals["range"]}
    return env


_ENV = _environment()


def _check(tree: nodes.Node) -> None:
    for node in tree.find_all(nodes.Node):
        if isinstance(node, _FORBIDDEN):
            what = _WHAT.get(type(node), type(node).__name__)
            raise TemplateError(f"`{what}` is not allowed in a task template")
        if isinstance(node, nodes.Name) and node.name.startswith("_"):
            raise TemplateError(f"the name {node.name!r} is not allowed (names may not start with '_')")
        if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
            raise TemplateError(f"the attribute {node.attr!r} is not allowed (names may not start with '_')")
        if (
            isinstance(node, nodes.Getitem)
            and isinstance(node.arg, nodes.Const)
            and isinstance(node.arg.value, str)
            and node.arg.value.startswith("_")
        ):
            raise TemplateError(f"the key {node.arg.value!r} is not allowed (names may not start with '_')")
        if isinstance(node, (nodes.Filter, nodes.FilterBlock)):
            filt = node if isinstance(node, nodes.Filter) else node.filter
            if filt.name not in _ENV.filters:
                raise TemplateError(
                    f"the filter {filt.name!r} is not allowed (allowed: {', '.join(sorted(FILTERS))})"
                )
        if isinstance(node, nodes.Test) and node.name not in _ENV.tests:
            raise TemplateError(f"the test {node.name!r} is not known")


def compile_template(source: Any) -> jinja2.Template:
    """The sandboxed template for `source`, or `TemplateError` saying what is not allowed."""
    if not isinstance(source, str):
        raise TemplateError(f"a template is a string, not {type(source).__name__}")
    if source.lstrip().startswith("!function"):
        raise TemplateError("`!function` (code named by a task) is not allowed in an inline task")
    try:
        tree = _ENV.parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"not a valid template: {e.message} (line {e.lineno})") from e
    _check(tree)
    return _ENV.from_string(source)


class TaskTemplate:
    """One compiled template of an inline task, called by lm-eval on each row.

    It returns what lm-eval's own rendering of the same string would: a field's value when the
    template is just a field name; the text, or a number for a text of digits when the task has
    choices; for choices, the list the text spells (`ast.literal_eval`, which evaluates literals
    only); for a target, a list when the text spells one.
    """

    def __init__(self, source: str, kind: str, has_choices: bool) -> None:
        if kind not in TEMPLATE_FIELDS:
            raise ValueError(f"kind must be one of {TEMPLATE_FIELDS}, not {kind!r}")
        self.source = source
        self.kind = kind
        self.has_choices = has_choices
        self._template = compile_template(source)

    def __call__(self, doc: Mapping[str, Any]) -> Any:
        if self.source in doc:
            return doc[self.source]
        text = self._template.render(**doc)
        if self.kind == "doc_to_choice":
            return ast.literal_eval(text)
        if text.isdigit() and self.has_choices:
            return ast.literal_eval(text)
        if self.kind == "doc_to_target" and len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                return ast.literal_eval(text)
            except (SyntaxError, ValueError):
                return text
        return text

    # lm-eval deep-copies task configs, and Ray pickles them: a compiled Jinja template can be
    # neither, so copies share the (immutable) template and pickles recompile it from the source.
    def __deepcopy__(self, memo: dict[int, Any]) -> TaskTemplate:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, str, bool]]:
        return (TaskTemplate, (self.source, self.kind, self.has_choices))

    def __repr__(self) -> str:
        # lm-eval writes a task's config into its results; a callable is written as its str().
        return self.source

    __str__ = __repr__
