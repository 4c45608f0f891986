"""Bug injection by AST program transformations, applied as minimal text edits (comments and layout survive).

Each `Mutation` replaces one source segment found through the AST: a binary, augmented-assignment, comparison
or boolean operator; an integer or boolean constant; a condition negated (or its `not` removed); a returned
value replaced by None; a statement removed (a call, an augmented or attribute/item assignment, `break` or
`continue` becomes `pass`). Only code inside functions is mutated, only within one line.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

__all__ = ["Mutation", "apply_mutation", "find_mutations"]

_BINOPS: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.Div: ("/", "*"), ast.FloorDiv: ("//", "*"),
    ast.Mod: ("%", "//"), ast.Pow: ("**", "*"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
    ast.BitOr: ("|", "&"), ast.BitAnd: ("&", "|"), ast.BitXor: ("^", "|"),
}  # fmt: skip
_CMPOPS: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"), ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}  # fmt: skip
_BOOLOPS: dict[type[ast.boolop], tuple[str, str]] = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass(frozen=True)
class Mutation:
    path: str  # file, relative to the repository root
    kind: str  # operator | compare | boolop | constant | negate | return | remove
    line: int  # 1-based
    start: int  # character columns of the replaced segment on that line
    end: int
    original: str
    replacement: str
    function: str  # qualified name of the enclosing function

    @property
    def key(self) -> str:
        raw = f"{self.path}:{self.line}:{self.start}:{self.end}:{self.replacement}"
        return hashlib.sha1(raw.encode()).hexdigest()[:8]

    def describe(self) -> str:
        return f"{self.kind}: {self.original!r} -> {self.replacement!r} in {self.path}:{self.line} ({self.function})"


def apply_mutation(source: str, m: Mutation) -> str:
    lines = source.splitlines(keepends=True)
    text = lines[m.line - 1]
    assert text[m.start : m.end] == m.original, f"stale mutation {m.describe()}"
    lines[m.line - 1] = text[: m.start] + m.replacement + text[m.end :]
    return "".join(lines)


def find_mutations(path: str, source: str) -> list[Mutation]:
    """Every mutation site of a module, in source order. A file that does not parse has none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    finder = _Finder(path, source.splitlines(keepends=True))
    finder.visit(tree)
    unique = {(m.line, m.start, m.end, m.replacement): m for m in finder.found}
    return sorted(unique.values(), key=lambda m: (m.line, m.start, m.kind, m.replacement))


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, lines: list[str]) -> None:
        self.path, self.lines = path, lines
        self.scope: list[str] = []
        self.found: list[Mutation] = []

    # -- helpers -------------------------------------------------------------------------------------------------

    def _col(self, line: int, byte_col: int) -> int:
        return len(self.lines[line - 1].encode()[:byte_col].decode("utf-8", "replace"))

    def _span(self, node: ast.expr | ast.stmt) -> tuple[int, int, int] | None:
        """(line, start, end) of a node that sits on one line, in characters."""
        line, end_line = node.lineno, node.end_lineno
        if line != end_line or line > len(self.lines) or node.end_col_offset is None:
            return None
        return line, self._col(line, node.col_offset), self._col(line, node.end_col_offset)

    def _add(self, kind: str, line: int, start: int, end: int, replacement: str) -> None:
        text = self.lines[line - 1]
        if not self.scope or "pragma: no cover" in text or "# nomutate" in text:
            return
        original = text[start:end]
        if original != replacement and original.strip():
            self.found.append(Mutation(self.path, kind, line, start, end, original, replacement, ".".join(self.scope)))

    def _between(self, kind: str, left: ast.expr, right: ast.expr, old: str, new: str) -> None:
        """Replace the operator `old` found between two operands on the same line."""
        a, b = self._span(left), self._span(right)
        if not a or not b or a[0] != b[0]:
            return
        line, gap_start, gap_end = a[0], a[2], b[1]
        gap = self.lines[line - 1][gap_start:gap_end]
        words = gap.replace("(", " ").replace(")", " ").split()
        if words != old.split():  # anything else in the gap (comments, odd layout): skip
            return
        i = gap.find(old.split()[0])
        j = gap.rfind(old.split()[-1]) + len(old.split()[-1])
        self._add(kind, line, gap_start + i, gap_start + j, new)

    # -- scopes --------------------------------------------------------------------------------------------------

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        for child in node.body:  # decorators, defaults and annotations are left alone
            self.visit(child)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scoped(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        saved, self.scope = self.scope, [*self.scope, node.name]
        for child in node.body:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.visit(child)
        self.scope = saved

    def visit_Assert(self, node: ast.Assert) -> None:
        return  # assertions are not behaviour

    def visit_Raise(self, node: ast.Raise) -> None:
        return  # nor are error messages

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return

    # -- operators -----------------------------------------------------------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if (ops := _BINOPS.get(type(node.op))) and not _is_str(node.left) and not _is_str(node.right):
            self._between("operator", node.left, node.right, *ops)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if ops := _BINOPS.get(type(node.op)):
            self._between("operator", node.target, node.value, ops[0] + "=", ops[1] + "=")
        self._remove(node)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if ops := _CMPOPS.get(type(op)):
                self._between("compare", operands[i], operands[i + 1], *ops)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = _BOOLOPS[type(node.op)]
        for left, right in zip(node.values, node.values[1:], strict=False):
            self._between("boolop", left, right, old, new)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        span, value = self._span(node), node.value
        if span is None:
            return
        if isinstance(value, bool):
            self._add("constant", *span, str(not value))
        elif isinstance(value, int) and self.lines[span[0] - 1][span[1] : span[2]].isdigit():
            self._add("constant", *span, "1" if value == 0 else "0" if value == 1 else str(value + 1))

    # -- conditions, returns, statements -------------------------------------------------------------------------

    def _negate(self, test: ast.expr) -> None:
        span = self._span(test)
        if span is None:
            return
        text = self.lines[span[0] - 1][span[1] : span[2]]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and (inner := self._span(test.operand)):
            self._add("negate", *span, self.lines[inner[0] - 1][inner[1] : inner[2]])
        else:
            self._add("negate", *span, f"not ({text})" if " " in text else f"not {text}")

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        returns_none = node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None)
        if not returns_none and (span := self._span(node.value)):  # type: ignore[arg-type]
            self._add("return", *span, "None")
        self.generic_visit(node)

    def _remove(self, node: ast.stmt) -> None:
        if span := self._span(node):
            line, start, end = span
            if self.lines[line - 1][:start].strip() == "" and not self.lines[line - 1][end:].strip().startswith(";"):
                self._add("remove", line, start, end, "pass")

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call):
            self._remove(node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if all(isinstance(t, ast.Attribute | ast.Subscript) for t in node.targets):
            self._remove(node)
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self._remove(node)

    def visit_Continue(self, node: ast.Continue) -> None:
        self._remove(node)


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
