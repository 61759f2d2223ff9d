"""The functions a captured source defines, found by parsing the snapshot (``ast``), so that a
result lists the ones that never ran (0 calls) beside those that did."""

from __future__ import annotations

import ast


def defined_functions(text: str) -> list[tuple[str, int]]:
    """``(qualname, first_line)`` of every ``def`` / ``async def`` in ``text``, named as Python
    names their code objects (``Class.method``, ``outer.<locals>.inner``) and placed on the
    code object's first line (the first decorator's line when decorated). Lambdas and
    comprehensions are left out. A source that does not parse defines nothing here."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[str, int]] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + node.name
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found.append((name, first))
                visit(node.body, name + ".<locals>.")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            else:  # definitions under if / try / with / for blocks are still definitions
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child], prefix)

    visit(tree.body, "")
    return found
