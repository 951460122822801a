"""The agent benchmark's world: a tiny Python package held in a dict, the tools an agent works it with
(list, read and write files, run the tests in a subprocess on a temporary copy), the tasks that edit it,
and what kind of step a reply is (a file rewritten, or anything else)."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The project's files: comments for docstrings and single quotes, so that a file's JSON form (in a
# write_file call) escapes only its newlines: a 1.5B model closes the JSON string at a triple quote.
CART = """# Shopping cart arithmetic: line totals, the cart's total, discounts and prices as text.

from __future__ import annotations

TAX_RATE = 0.2


def line_total(price: float, quantity: int) -> float:
    # The price of quantity items at price each.
    if quantity < 0:
        raise ValueError('quantity must not be negative')
    return price * quantity


def calc_total(items: list[tuple[float, int]]) -> float:
    # The total of a cart's lines, each a (price, quantity) pair.
    total = 0.0
    for price, quantity in items:
        total += line_total(price, quantity)
    return round(total, 2)


def apply_discount(total: float, percent: float) -> float:
    # total less percent per cent (0 to 100).
    if not 0 <= percent <= 100:
        raise ValueError('percent must be between 0 and 100')
    return round(total * (100 - percent) / 100, 2)


def with_tax(total: float) -> float:
    # total with the tax added.
    return round(total * (1 + TAX_RATE), 2)


def format_price(amount: float) -> str:
    # amount as a price, e.g. $12.50.
    return f'${amount:,.2f}'


def receipt(items: list[tuple[float, int]], percent: float = 0) -> str:
    # A one-line receipt: the total after the discount, with tax.
    total = apply_discount(calc_total(items), percent)
    return f'Total: {format_price(with_tax(total))}'
"""

STATS = """# Small statistics over lists of numbers.

from __future__ import annotations


def mean(values: list[float]) -> float:
    # The arithmetic mean (values must not be empty).
    if not values:
        raise ValueError('mean of an empty list')
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    # The middle value; for an even count, the mean of the two middle values.
    if not values:
        raise ValueError('median of an empty list')
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle] + ordered[middle + 1]) / 2


def spread(values: list[float]) -> float:
    # The largest value minus the smallest.
    if not values:
        raise ValueError('spread of an empty list')
    return max(values) - min(values)


def clamp(value: float, low: float, high: float) -> float:
    # value limited to the range low to high.
    if low > high:
        raise ValueError('low must not exceed high')
    return max(low, min(value, high))
"""

TEST_CART = """import unittest

from shop.cart import apply_discount, calc_total, format_price, line_total, receipt


class CartTest(unittest.TestCase):
    def test_line_total(self):
        self.assertEqual(line_total(2.5, 4), 10.0)
        with self.assertRaises(ValueError):
            line_total(1.0, -1)

    def test_total(self):
        self.assertEqual(calc_total([(2.5, 4), (1.25, 2)]), 12.5)
        self.assertEqual(calc_total([]), 0.0)

    def test_discount(self):
        self.assertEqual(apply_discount(200.0, 15), 170.0)
        with self.assertRaises(ValueError):
            apply_discount(10.0, 120)

    def test_format_price(self):
        self.assertEqual(format_price(1234.5), '$1,234.50')

    def test_receipt(self):
        self.assertEqual(receipt([(10.0, 2)], 50), 'Total: $12.00')


if __name__ == '__main__':
    unittest.main()
"""

TEST_STATS = """import unittest

from shop.stats import clamp, mean, median, spread


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)
        self.assertEqual(median([5, 7]), 6)

    def test_spread(self):
        self.assertEqual(spread([3, 9, 4]), 6)

    def test_clamp(self):
        self.assertEqual(clamp(12, 0, 10), 10)
        self.assertEqual(clamp(-1, 0, 10), 0)


if __name__ == '__main__':
    unittest.main()
"""

FILES: dict[str, str] = {
    "shop/__init__.py": "# A tiny shop: cart arithmetic and statistics.\n",
    "shop/cart.py": CART,
    "shop/stats.py": STATS,
    "tests/test_cart.py": TEST_CART,
    "tests/test_stats.py": TEST_STATS,
}


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    #: tool_choice per step: a function's name, "none", "required" or "auto"; ``then`` after these
    forced: tuple[str, ...] = ("read_file",)  # an agent reads before it writes (a 1.5B model may not)
    then: str = "required"  # a call every step (a small model's free text may mean a call: ```json)


TASKS = (
    Task(
        "rename",
        "In shop/cart.py, rename the function `calc_total` to `cart_total`, and update every use of it "
        "(in shop/cart.py and in tests/test_cart.py).",
    ),
    Task(
        "fix-median",
        "The test test_median_even fails: `median` in shop/stats.py returns a wrong value for lists of "
        "even length. Fix the bug.",
    ),
    Task(
        "add-currency",
        "Add a parameter `currency: str = '$'` to `format_price` in shop/cart.py, the text written before "
        "the amount, so that format_price(5, 'EUR ') returns 'EUR 5.00'.",
    ),
)


SYSTEM = (
    "You are a coding agent working on a small Python project with these files: {files}. Answer with "
    "tool calls. To change a file, read it, then call write_file with the complete new file: every line "
    "of it, the unchanged lines too. After changing files, call run_tests. When the tests pass, call "
    "finish with one short sentence saying what you changed. For example, read_file gives "
    '{{"path": "a.py", "content": "# A.\\nX = 1\\n"}}, and to set X to 2 you call write_file with '
    '{{"path": "a.py", "content": "# A.\\nX = 2\\n"}}.'
)


def tool_schemas(files: list[str]) -> list[dict[str, Any]]:
    """The tools an agent is offered (OpenAI function tools)."""

    def fn(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
        params = {
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": params},
        }

    path = {"type": "string", "description": "the file's path, e.g. shop/cart.py"}
    return [
        fn("list_files", "The project's files, one per line.", {}),
        fn(
            "read_file",
            "A file's whole content (JSON: its path and content).",
            {"path": {**path, "enum": sorted(files)}},
        ),
        fn(
            "write_file",
            "Replace a file (or create it) with the complete new content.",
            {"path": path, "content": {"type": "string", "description": "the whole new file"}},
        ),
        fn("run_tests", "Run the project's unit tests; their output.", {}),
        fn("finish", "End the task.", {"summary": {"type": "string", "description": "what you changed"}}),
    ]


TEST_TIMEOUT_S = 60.0
OUTPUT_LIMIT = 1500  # characters of the tests' output an agent is shown (the end of it)


@dataclass
class Project:
    """A project's files in memory, and the tools that work on them."""

    files: dict[str, str] = field(default_factory=lambda: dict(FILES))

    def call(self, name: str, arguments: str) -> str:
        """Run a tool call (arguments as JSON text); what the tool answers (errors as text, as agents do)."""
        try:
            args = json.loads(arguments or "{}")
        except ValueError as e:
            return f"error: the arguments are not JSON: {e}"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        try:
            if name == "list_files":
                return "\n".join(sorted(self.files))
            if name == "read_file":
                path = str(args.get("path", ""))
                if path not in self.files:
                    return f"error: no such file: {path}"
                # as JSON, the form a write_file call gives it back in (raw text: see docs/benchmarks.md)
                return json.dumps({"path": path, "content": self.files[path]})
            if name == "write_file":
                path, content = args.get("path"), args.get("content")
                if not isinstance(path, str) or not path or not isinstance(content, str):
                    return "error: write_file needs a path and a content (strings)"
                if path.startswith("/") or ".." in Path(path).parts:
                    return f"error: {path} is outside the project"
                self.files[path] = content
                return f"wrote {path} ({len(content.splitlines())} lines)"
            if name == "run_tests":
                return self.run_tests()
            if name == "finish":
                return "done"
        except Exception as e:  # a tool never stops the benchmark
            return f"error: {type(e).__name__}: {e}"
        return f"error: no tool named {name}"

    def run_tests(self) -> str:
        """The unit tests run on a copy of the files in a temporary folder, in a subprocess."""
        with tempfile.TemporaryDirectory(prefix="tandem-agent-") as tmp:
            root = Path(tmp)
            for path, text in self.files.items():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text, encoding="utf-8")
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "unittest", "discover", "-s", "tests"],
                    cwd=root,
                    capture_output=True,
                    text=True,
                    timeout=TEST_TIMEOUT_S,
                    env={"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
                )
            except subprocess.TimeoutExpired:
                return f"error: the tests ran over {TEST_TIMEOUT_S:.0f} s"
            # the same run reads the same each time: no temporary path, no duration
            out = (done.stdout + done.stderr).replace(f"{root}{os.sep}", "").strip()
            out = re.sub(r"(Ran \d+ tests?) in [\d.]+s", r"\1", out)
            verdict = "passed" if done.returncode == 0 else f"failed (exit code {done.returncode})"
            return f"tests {verdict}\n{out[-OUTPUT_LIMIT:]}"


REWRITE_SHARE = 0.5  # a write repeating at least this share of the existing file is a rewrite


def repeated_share(old: str, new: str) -> float:
    """The characters ``new`` repeats from ``old`` (matching blocks), as a share of the longer of the two
    (a fragment of the file is not a rewrite of it)."""
    if not new or not old:
        return 0.0
    blocks = difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks()
    return sum(b.size for b in blocks) / max(len(old), len(new))


def step_kind(tool_calls: list[tuple[str, str]], files: dict[str, str]) -> str:
    """``rewrite`` when a call writes a file mostly as it was (``files``: before the step), ``call`` for
    other tool calls, ``answer`` for a reply without calls."""
    if not tool_calls:
        return "answer"
    for name, arguments in tool_calls:
        if name != "write_file":
            continue
        try:
            args = json.loads(arguments)
        except ValueError:
            continue
        old = files.get(args.get("path", "")) if isinstance(args, dict) else None
        content = args.get("content") if isinstance(args, dict) else None
        if (
            isinstance(old, str)
            and isinstance(content, str)
            and repeated_share(old, content) >= REWRITE_SHARE
        ):
            return "rewrite"
    return "call"
