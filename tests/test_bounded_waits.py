"""No wait on another party without a deadline in proving/ or the test kits (proving.deadlines).

An AST walk over every module of proving/ and the tests' shared helpers
(fixtures, the harness, tests/support.py; each test itself is bounded by its
pytest timeout): an `await` of a call known to
wait on a broker, a database, a child process or a socket for as long as
the other side keeps quiet must name its bound where it waits: a
`timeout=` argument, or an enclosing `deadline(...)`, `asyncio.timeout(...)`
(`async with`), or `within(...)` / `asyncio.wait_for(...)` around it. An
`await` of a bare task or future counts as such a wait too. A wait that is
unbounded by design (a proxy pumping bytes while its connection lives) says
why on one of its lines or the line above: `# unbounded: <reason>`. Handlers (a `Context` parameter)
run under the framework's own handler deadline and are not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.support import ROOT

# Calls that wait on another party with no end of their own unless given one.
UNBOUNDED = frozenset(
    {
        # the broker (aio-pika, aiormq)
        "connect",
        "connect_robust",
        "channel",
        "declare_queue",
        "declare_exchange",
        "get",
        "publish",
        "purge",
        "queue_delete",
        "consume",
        "ack",
        "nack",
        "reject",
        # the database (asyncpg)
        "create_pool",
        "fetch",
        "fetchval",
        "fetchrow",
        "execute",
        "executemany",
        # child processes, sockets, events, queues, locks
        "wait",
        "communicate",
        "open_connection",
        "read",
        "readexactly",
        "readline",
        "readuntil",
        "drain",
        "wait_closed",
        "join",
        "acquire",
    }
)
BOUNDING_SCOPES = frozenset({"deadline", "timeout", "timeout_at"})
WAIVER = "# unbounded: "


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _has_timeout(call: ast.Call) -> bool:
    return any(
        k.arg == "timeout" and not (isinstance(k.value, ast.Constant) and k.value.value is None)
        for k in call.keywords
    )


def _is_handler(function: ast.AsyncFunctionDef) -> bool:
    params = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    return any(p.annotation is not None and _name(p.annotation) == "Context" for p in params)


class _Finder(ast.NodeVisitor):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.bounded = 0  # depth of enclosing bounding `async with` in this function
        self.found: list[tuple[int, str]] = []

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        if _is_handler(node):
            return
        outer, self.bounded = self.bounded, 0  # a bound does not reach into a nested def
        self.generic_visit(node)
        self.bounded = outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.bounded = self.bounded, 0
        self.generic_visit(node)
        self.bounded = outer

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        scoped = any(
            isinstance(item.context_expr, ast.Call)
            and _name(item.context_expr.func) in BOUNDING_SCOPES
            for item in node.items
        )
        for item in node.items:
            self.visit(item)
        self.bounded += scoped
        for statement in node.body:
            self.visit(statement)
        self.bounded -= scoped

    def visit_Await(self, node: ast.Await) -> None:
        self.generic_visit(node)
        span = self.lines[max(node.lineno - 2, 0) : (node.end_lineno or node.lineno)]
        if self.bounded or any(WAIVER in line for line in span):
            return
        value = node.value
        if isinstance(value, ast.Call):
            if _name(value.func) in UNBOUNDED and not _has_timeout(value):
                self.found.append((node.lineno, ast.unparse(value)[:80]))
        elif isinstance(value, ast.Name | ast.Attribute | ast.Subscript):
            self.found.append((node.lineno, f"await {ast.unparse(value)} (a task or future)"))


def unbounded_waits(text: str, where: str) -> Iterator[str]:
    """`where:line: call` of each unbounded wait in the module `text`."""
    finder = _Finder(text.splitlines())
    finder.visit(ast.parse(text))
    for line, call in finder.found:
        yield f"{where}:{line}: {call}"


# The tests' shared plumbing: every test's waits on the services go through these.
TEST_HELPERS = (
    "conftest.py",
    "harness.py",
    "support.py",
    "ingress_support.py",
    "scripted_http.py",
    "quickstart.py",
    "guide_examples.py",
)


def test_no_wait_in_proving_or_the_tests_helpers_is_without_a_deadline() -> None:
    paths = [
        *(ROOT / "proving").rglob("*.py"),
        *(ROOT / "consumers" / "testing").rglob("*.py"),  # the harness users get
        *(ROOT / "tests" / name for name in TEST_HELPERS),
    ]
    found = [
        wait
        for path in sorted(paths)
        for wait in unbounded_waits(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "waits with no deadline (see proving.deadlines):\n" + "\n".join(found)


def test_the_check_finds_an_unbounded_get_and_passes_a_bounded_one() -> None:
    module = (
        "import asyncio\n"
        "async def f(queue, channel, proc, task):\n"
        "    await queue.get(fail=False)\n"  # 3: flagged
        "    await queue.get(timeout=5)\n"
        "    async with asyncio.timeout(3):\n"
        "        await channel.declare_queue('q', passive=True)\n"
        "    await asyncio.wait_for(proc.wait(), 5)\n"
        "    await proc.wait()\n"  # 8: flagged
        "    await task\n"  # 9: flagged
        "    await proc.wait()  # unbounded: the test says so\n"
    )
    lines = [w.split(":")[1] for w in unbounded_waits(module, "probe.py")]
    assert lines == ["3", "8", "9"]
