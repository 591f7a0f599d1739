"""Answers refused before they run: those that import the reference solution, the book's printed numbers, or
the book's own function for the very thing the exercise asks (issue 54).

The reader's source is read, never run, here. The threat is a learner's shortcut, not an attacker's
obfuscation: an import, an attribute or a name given as a string gives the shortcut away. The book's classes
stay open (3.1 to 3.3 are about using them), and so do its helpers (``softmax_stable``): only the function
that is the answer is closed. The collector's process also keeps these modules out of reach
(``collect.Barrier``) and refuses a function that was not written in the answer's file.
"""

from __future__ import annotations

import ast

from attnlab.exercises.finding import Finding

SOLUTIONS = "attnlab.exercises"  # the reference solutions, and the judge that holds what they must give
GOLDEN = "attnlab.book.golden"  # the numbers the book prints
BOOK_FUNCTIONS: dict[str, tuple[str, ...]] = {  # the book's own function for what each exercise asks
    "3.1": ("transfer_v2_to_v1",),
    "3.A": ("all_context_vectors",),  # its second value is every attention weight
    "3.C": ("causal_weights_masked", "causal_weights_renormalized"),  # section 3.5's two methods
}


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a name; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def _reached(node: ast.AST) -> list[str]:
    """The dotted names ``node`` imports or reaches: an import, an attribute chain, a string naming a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    if isinstance(node, ast.Attribute):  # on a call's result too: import_module("attnlab.book").name
        return [_dotted(node) or node.attr]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]  # importlib.import_module("attnlab.exercises.solutions.ex_3_b")
    return []


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def refusal(exercise: str, source: str) -> Finding | None:
    """The refusal for an answer whose ``source`` takes a shortcut; None for one that may run."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # the collector reports it, with its line
    own = BOOK_FUNCTIONS.get(exercise, ())
    nodes = list(ast.walk(tree))
    for node in nodes:
        for name in _reached(node):
            if _within(name, SOLUTIONS):
                return Finding(False, "refused.solution", {"module": name})
            if ".book.golden." in f".{name}.":  # attnlab.book.golden, or book.golden after from attnlab import book
                return Finding(False, "refused.golden", {"module": GOLDEN})
            if name.rpartition(".")[2] in own and not isinstance(node, ast.Constant):
                return Finding(False, "refused.book", {"name": name.rpartition(".")[2]})
        if isinstance(node, ast.Constant) and node.value in own:  # getattr(book, "transfer_v2_to_v1")
            return Finding(False, "refused.book", {"name": node.value})
    starred = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in nodes)
    written = {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    for node in nodes:  # from attnlab.book import *, then the function by its bare name
        if starred and isinstance(node, ast.Name) and node.id in own and node.id not in written:
            return Finding(False, "refused.book", {"name": node.id})
    return None
