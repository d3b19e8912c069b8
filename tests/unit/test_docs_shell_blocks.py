"""The docs' shell blocks, read without running them (tests/contract/test_docs_blocks.py runs them):
the parser finds every shell fence, and no block that runs holds usage notation."""

import re

from tests.contract.test_docs_blocks import PAGES, name, shell_blocks

#: Usage notation: optional parts in brackets, alternatives, placeholders (write it in ```text).
USAGE = re.compile(r"\[--|\| --|<[a-z][a-z ]*>")


def test_the_parser_finds_every_shell_fence():
    for page in PAGES:
        fences = len(re.findall(r"^\s*```(?:sh|bash|shell|console)\s*$", page.read_text(), re.M))
        run, skipped = shell_blocks(page)
        assert fences == len(run) + len(skipped), f"{name(page)}: {fences} shell fences, {len(run) + len(skipped)} blocks read"


def test_no_block_that_runs_holds_usage_notation():
    for page in PAGES:
        for block in shell_blocks(page)[0]:
            for line in block.code.splitlines():
                command = line.split(" #", 1)[0]
                assert not USAGE.search(command), (f"{name(page)}, block at line {block.lineno}: usage notation in a shell "
                                                   f"block ({line.strip()!r}): write it as ```text, or run a real command")
