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

What a template may cost is bounded too, since planning renders every row of a shared manifest's
task (a template that never ends would hang `drydock plan`):

  - nothing is evaluated at compile time (Jinja's optimizer folds constants: `9**(9**9)` ran in
    C for ever, deaf to Ctrl-C), and `**` is refused;
  - loops do not nest and are not `recursive`, and `block`s (which can call themselves) are
    refused, so a template does work in proportion to its row and its constants;
  - values are bounded as they are made: strings and lists at `MAX_SIZE` items, integers at
    `MAX_INT_BITS` bits, `range` at `MAX_SIZE`, widths in a format or a filter at `MAX_SIZE`;
  - a render stops after `MAX_RENDER_SECONDS` (checked at every call, filter, attribute, item,
    operator and piece of output) or `MAX_SIZE` characters of output; regular expressions run in
    the `regex` engine with the time left as its timeout (Python's `re` cannot be interrupted);
  - `eval_tasks.check_rows` stops a file whose rows take over `MAX_CHECK_SECONDS` together.

Each is a `TemplateError` naming the limit.
"""

from __future__ import annotations

import ast
import functools
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
import regex
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "FILTERS",
    "MAX_CHECK_SECONDS",
    "MAX_INT_BITS",
    "MAX_RENDER_SECONDS",
    "MAX_SIZE",
    "TEMPLATE_FIELDS",
    "TaskTemplate",
    "TemplateError",
    "compile_template",
    "render",
]

MAX_SIZE = 1_000_000
"""The most characters (items, for a list) a value or a render's output may hold."""
MAX_INT_BITS = 4096
"""The largest integer a template may compute, in bits."""
MAX_RENDER_SECONDS = 2.0
"""The longest one render may take (a row's prompt renders in tens of microseconds)."""
MAX_CHECK_SECONDS = 60.0
"""The longest the templates of one task may take over all the rows of one file, at check time."""

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
    """A template outside the allowed subset, one Jinja cannot parse, or a render over a limit."""


_deadline = threading.local()
"""The monotonic time the render in progress on this thread must end by (`_Render`)."""


def _time_left() -> float:
    left = getattr(_deadline, "at", float("inf")) - time.monotonic()
    if left <= 0:
        raise TemplateError(f"the template took more than {MAX_RENDER_SECONDS:g} s to render one row")
    return left


def _check_value(value: Any) -> Any:
    """`value` if it is within the size limits, else a `TemplateError`."""
    if isinstance(value, str | bytes | list | tuple | dict) and len(value) > MAX_SIZE:
        raise TemplateError(f"a value of {len(value):,} items is over the limit of {MAX_SIZE:,}")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateError(f"an integer of {value.bit_length():,} bits is over the limit of {MAX_INT_BITS}")
    return value


_DIGITS = len(str(MAX_SIZE))
_WIDE_FORMAT = re.compile(
    rf"%[-+ #0]*(\(\w*\))?[-+ #0]*\d{{{_DIGITS},}}"  # %9999999d
    rf"|%[^a-zA-Z%]*\.\d{{{_DIGITS},}}"  # %.9999999f
    rf"|{{[^{{}}]*:[^{{}}]*\d{{{_DIGITS},}}"  # {:>9999999}
)
"""A %-format or a str.format field with a width or precision of `MAX_SIZE` or more."""


def _check_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse a width or count that would make a value over the limits before it is made
    (`'x'.center(10**9)`): Python would build it in C, unstoppable."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SIZE:
            raise TemplateError(f"the argument {value:,} is over the limit of {MAX_SIZE:,}")


def _check_format(spec: Any) -> None:
    """Refuse a format string whose widths would make a value over the limits
    (`'%9999999999d' % 1`, `'{:>9999999999}'.format(1)`)."""
    if isinstance(spec, str) and _WIDE_FORMAT.search(spec):
        raise TemplateError(f"a format with a width of {MAX_SIZE:,} or more is not allowed")


def _bounded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that checks the time, its arguments and its result."""

    @functools.wraps(fn)  # keeps Jinja's pass_context/pass_environment marks
    def filter_(*args: Any, **kwargs: Any) -> Any:
        _time_left()
        _check_arguments(args, kwargs)
        if fn.__name__ == "do_format":
            _check_format(args[0] if args else None)
        return _check_value(fn(*args, **kwargs))

    return filter_


def _regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    """lm-eval's `regex_replace` filter (`re.sub`), which its registry templates use. It runs in
    the `regex` engine (the same syntax for what templates use), which takes a timeout: Python's
    `re` backtracks in C without returning to the interpreter, so no signal or check can stop it."""
    try:
        left = _time_left()
        return regex.sub(pattern, repl, string, count=count, timeout=None if left == float("inf") else left)
    except TimeoutError:
        raise TemplateError(
            f"the regular expression {pattern!r} took more than {MAX_RENDER_SECONDS:g} s"
        ) from None


def _range(*args: int) -> range:
    _check_arguments(args, {})
    return range(*args)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with every operation that makes a value checked against the limits and the
    render's deadline."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _time_left()
        if operator == "*":
            for a, b in ((left, right), (right, left)):
                if isinstance(a, str | list | tuple) and isinstance(b, int) and len(a) * b > MAX_SIZE:
                    raise TemplateError(f"a value of {len(a) * b:,} items is over the limit of {MAX_SIZE:,}")
            ints = isinstance(left, int) and isinstance(right, int)
            if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateError(f"an integer over {MAX_INT_BITS} bits is over the limit")
        if operator == "%":
            _check_format(left)
        return _check_value(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _time_left()
        _check_arguments(args, kwargs)
        return _check_value(super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _time_left()
        if attribute in {"format", "format_map"}:  # the sandbox wraps str.format: checked here
            _check_format(obj)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _time_left()
        if argument in {"format", "format_map"}:  # `s['format']` is `s.format` to Jinja
            _check_format(obj)
        return super().getitem(obj, argument)


class _BoundedTemplate(jinja2.Template):
    """A template whose `render` is `render` (bounded), however it is called."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        return render(self, dict(*args, **kwargs))


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        loader=None,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        optimized=False,  # no constant folding: nothing a template says is computed at compile time
    )
    env.filters = {name: _bounded(fn) for name, fn in env.filters.items() if name in FILTERS}
    env.filters["regex_replace"] = _bounded(_regex_replace)
    # lipsum, cycler, joiner, namespace and dict are not needed to format a row: only range stays.
    env.globals = {"range": _range}
    env.template_class = _BoundedTemplate
    return env


def render(template: jinja2.Template, values: Mapping[str, Any]) -> str:
    """Render `template` with `values` within the limits (see the module's docstring)."""
    _deadline.at = time.monotonic() + MAX_RENDER_SECONDS
    try:
        pieces: list[str] = []
        size = 0
        for piece in template.generate(**values):
            _time_left()
            size += len(piece)
            if size > MAX_SIZE:
                raise TemplateError(f"the output is over the limit of {MAX_SIZE:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _deadline.at = float("inf")


_ENV = _environment()


def _check(tree: nodes.Node) -> None:
    for node in tree.find_all(nodes.Node):
        if isinstance(node, nodes.Pow):
            raise TemplateError(
                "`**` is not allowed in a task template (a power can be a number of any size)"
            )
        if isinstance(node, nodes.Block):
            raise TemplateError("`block` is not allowed in a task template")
        if isinstance(node, nodes.For):
            if node.recursive:
                raise TemplateError("a `recursive` loop is not allowed in a task template")
            if any(inner is not node for inner in node.find_all(nodes.For)):
                raise TemplateError("loops may not nest in a task template (its cost would be unbounded)")
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
        text = render(self._template, doc)
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
