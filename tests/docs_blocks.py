"""The code blocks of the user pages (README.md, docs/*.md), read and run for the tests that check them
(tests/test_docs.py, tests/test_docs_pages.py), and the stand-ins those tests run them on."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: its language (`"python"`, `"bash"`, ...), its text and the line it starts on."""

    language: str
    text: str
    line: int

    @property
    def is_python(self) -> bool:
        return self.language in PYTHON

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL


def code_blocks(page: Path) -> list[Block]:
    """Every fenced code block of `page`, in order."""
    text = page.read_text()
    return [
        Block(match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1) for match in _FENCE.finditer(text)
    ]


def python_blocks(page: Path) -> list[str]:
    """The text of every Python block of `page` (fenced as `python` or `py`), in order."""
    return [block.text for block in code_blocks(page) if block.is_python]


def with_stand_ins(code: str, stand_ins: dict[str, str]) -> str:
    """`code` with each quoted name of `stand_ins` (a Hub id, a placeholder path) replaced by its stand-in, quoted."""
    for name, path in stand_ins.items():
        code = code.replace(f'"{name}"', repr(path))
    return code


def run_python(code: str, page: Path, namespace: dict, stand_ins: dict[str, str] | None = None) -> None:
    """Run one block of `page` in `namespace`, with the stand-ins' substitutions (tracebacks name the page)."""
    exec(compile(with_stand_ins(code, stand_ins or {}), str(page), "exec"), namespace)


def shell_commands(block: str, variables: dict[str, str] | None = None) -> list[list[str]]:
    """The commands of a shell block, each as its argument list: lines continued with a backslash joined, comments
    dropped, `$NAME` replaced from `variables` (a command substitution `$(...)` stays one argument, unexpanded)."""
    joined = re.sub(r"\\\n", " ", block)
    commands = []
    for line in joined.splitlines():
        for name, value in (variables or {}).items():
            line = line.replace(f"${name}", value)
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append(argv)
    return commands


def command_substitutions(block: str) -> list[str]:
    """The commands of a shell block's `$(...)` substitutions, as bash reads them (inner quotes included)."""
    found = []
    start = block.find("$(")
    while start != -1:
        depth, end = 1, start + 2
        while depth and end < len(block):
            depth += {"(": 1, ")": -1}.get(block[end], 0)
            end += 1
        found.append(block[start + 2 : end - 1])
        start = block.find("$(", end)
    return found


def tiny_smollm2(folder: Path) -> Path:
    """A tiny random Llama (4 layers, 64 wide) with SmolLM2-135M-Instruct's tokenizer, chat template and special
    tokens, saved to `folder`: it reads and writes the text a page's commands give SmolLM2, in a fraction of the time.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from hf_specdec.zoo import model_path

    tokenizer = AutoTokenizer.from_pretrained(model_path("smollm2-135m"))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
