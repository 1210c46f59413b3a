"""Dockerfile.operator and Dockerfile.runtime read as build stages, for the tests/images checks.

dockerfile-parse reads the instructions; a stage is one FROM and what follows it, with the
image or earlier stage it starts from (ARGs resolved, as the build resolves them).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

dockerfile_parse = pytest.importorskip(
    "dockerfile_parse", reason="pip install -r requirements/ship.txt (dockerfile-parse)"
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [
    pytest.param(ROOT / "Dockerfile.operator", id="operator"),
    pytest.param(ROOT / "Dockerfile.runtime", id="runtime"),
]
# A RUN's own options (--mount=..., --network=...) come before its shell script.
_RUN_FLAG = re.compile(r"--[a-z-]+=\S+")
# A `pip install` that fetches anything checks every file against the lock's hashes and
# resolves nothing.
HASH_CHECKED = re.compile(r"\bpip install (--no-cache-dir )?--require-hashes --no-deps .*-r \S+")


@dataclass(frozen=True)
class Instruction:
    """One instruction of a stage: its keyword (RUN, COPY...) and its text after the keyword."""

    keyword: str
    value: str


@dataclass(frozen=True)
class Stage:
    """`FROM <base> [AS <name>]` and the instructions up to the next FROM."""

    name: str | None
    base: str
    instructions: tuple[Instruction, ...]

    def values(self, keyword: str) -> list[str]:
        """The text of each `keyword` instruction of the stage, in order."""
        return [item.value for item in self.instructions if item.keyword == keyword]


def parse(path: Path) -> Any:
    """The parsed Dockerfile (dockerfile-parse reads from a file object, never writes)."""
    return dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def stages(path: Path) -> list[Stage]:
    """Every stage of the Dockerfile, in order; the last one is the image."""
    parsed = parse(path)
    bases = iter(parsed.parent_images)
    found: list[Stage] = []
    name: str | None = None
    base = ""
    items: list[Instruction] = []
    for item in parsed.structure:
        keyword, value = item["instruction"], item["value"]
        if keyword == "FROM":
            if base:
                found.append(Stage(name, base, tuple(items)))
            words = value.split()
            name = words[-1] if len(words) == 3 and words[1].upper() == "AS" else None
            base, items = next(bases), []
        elif base and keyword != "COMMENT":
            items.append(Instruction(keyword, value))
    found.append(Stage(name, base, tuple(items)))
    return found


def stage(path: Path, name: str) -> Stage:
    """The stage `FROM ... AS name`."""
    (named,) = [s for s in stages(path) if s.name == name]
    return named


def lineage(path: Path, name: str | None) -> list[Stage]:
    """The stage `name` and the stages it is built on, the one built on an image first.

    None names the image's own stage, the one without a name.
    """
    by_name = {s.name: s for s in stages(path)}
    chain = [by_name[name]]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    return chain


def instructions(path: Path, keyword: str, *, final_stage: bool = False) -> list[str]:
    """The text of every `keyword` instruction (of the image's own stage only, if asked)."""
    chosen = stages(path)[-1:] if final_stage else stages(path)
    return [value for s in chosen for value in s.values(keyword)]


def run_flags(value: str) -> tuple[list[str], str]:
    """A RUN's options (`--mount=type=secret,...`) and the shell script they apply to."""
    flags: list[str] = []
    script = value.strip()
    while match := _RUN_FLAG.match(script):
        flags.append(match.group())
        script = script[match.end() :].lstrip()
    return flags, script


def shell_commands(value: str) -> list[str]:
    """The commands of a RUN's script, split at &&, ||, ; and `then`."""
    _, script = run_flags(value)
    commands = [command.strip() for command in re.split(r"&&|\|\||;|\bthen\b", script)]
    return [command for command in commands if command]


def is_copy_from_context(value: str) -> bool:
    """A COPY of build-context files, not of another stage's (`--from=`)."""
    return not value.startswith("--from=")


def arg_defaults(dockerfile_stage: Stage) -> dict[str, str]:
    """The ARGs a stage declares, with their defaults (an ARG is seen only in its own stage)."""
    defaults: dict[str, str] = {}
    for value in dockerfile_stage.values("ARG"):
        if "=" in value:
            name, default = value.split("=", 1)
            defaults[name] = default.strip('"')
    return defaults
