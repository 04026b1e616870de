"""Source paths of `ingest.mapping`: where in a producer's row a chain field is. Pure Python, no Spark.

Grammar (checked at config time by `compile_source`, resolved per row by `Source.resolve`):

- a path: names joined by dots, list indices as `[0]`, `[-1]` or a numeric segment (`resps.0.0`); a numeric
  segment on an object is the key of that name. `[*]` (or a `*` segment) fans out: one value per list element.
- alternatives `a | b`: the first that gives a non-null value (a row-time error in one is remembered and raised
  only when no alternative gives a value).
- a template `{task}-{doc_id}-{sample_idx}`: text with paths in braces (`{{` and `}}` are literal braces);
  `{sample_idx}` is the fan-out index (0 when the mapping has none) unless the row has a `sample_idx` field.

Row-time problems are `PathError`s with a reason kind (the ingest quarantine reason), never other exceptions:
an index out of range (`path_index_out_of_range`), an index or name applied to a text or number
(`path_through_scalar`), a fan-out over an empty list (`empty_fan_out`) or over a non-list (`path_through_scalar`).
A missing object key gives None, as it always has (a missing field).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FAN_OUT = "*"
SAMPLE_IDX = "sample_idx"


class PathError(ValueError):
    """A row whose value a path cannot reach; `reason` is the quarantine reason kind."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class PathSyntaxError(ValueError):
    """A path that cannot be parsed: raised at config-check time, the message says what is wrong."""


Step = str | int  # a key, an index (int), or FAN_OUT


def parse(path: str) -> tuple[Step, ...]:
    """`choices[0].message.content` -> ('choices', 0, 'message', 'content'); numeric segments stay text keys
    that `_step` reads as an index on a list."""
    text = path.strip()
    if not text:
        raise PathSyntaxError("empty path")
    steps: list[Step] = []
    i, n = 0, len(text)
    expect_name = True  # at the start and after a dot a name (or number) must follow
    while i < n:
        ch = text[i]
        if ch == "[":
            close = text.find("]", i)
            if close < 0:
                raise PathSyntaxError(f"unbalanced '[' in {path!r}")
            inner = text[i + 1 : close].strip()
            if inner == FAN_OUT:
                steps.append(FAN_OUT)
            elif re.fullmatch(r"-?\d+", inner):
                steps.append(int(inner))
            else:
                raise PathSyntaxError(f"'[{inner}]' in {path!r}: an index is an integer or '*'")
            i = close + 1
            expect_name = False
        elif ch == "]":
            raise PathSyntaxError(f"unbalanced ']' in {path!r}")
        elif ch == ".":
            if expect_name:
                raise PathSyntaxError(f"empty segment in {path!r}")
            i += 1
            expect_name = True
            if i == n:
                raise PathSyntaxError(f"{path!r} ends with a dot")
        else:
            if not expect_name:
                raise PathSyntaxError(f"{path!r}: a name must follow a dot, not ']' directly")
            end = i
            while end < n and text[end] not in ".[]":
                end += 1
            name = text[i:end].strip()
            if not name:
                raise PathSyntaxError(f"empty segment in {path!r}")
            steps.append(FAN_OUT if name == FAN_OUT else name)
            i = end
            expect_name = False
    return tuple(steps)


def _step(value: Any, step: Step, shown: str) -> Any:
    if isinstance(value, Mapping):
        if isinstance(step, int):
            raise PathError("path_through_scalar", f"{shown}: an index into an object")
        return value.get(step)
    if isinstance(value, list):
        index = step
        if isinstance(step, str):
            if not re.fullmatch(r"-?\d+", step):
                raise PathError("path_through_scalar", f"{shown}: a name {step!r} into a list")
            index = int(step)
        assert isinstance(index, int)
        if not -len(value) <= index < len(value):
            raise PathError("path_index_out_of_range", f"{shown}: index {index} of a list of {len(value)}")
        return value[index]
    raise PathError("path_through_scalar", f"{shown}: {type(value).__name__} has no {step!r}")


def _walk(value: Any, steps: tuple[Step, ...], shown: str) -> Any:
    for step in steps:
        if value is None:
            return None  # a missing field on the way: missing, as a missing key always was
        if type(value) is dict and type(step) is str:  # the common case, without _step's checks
            value = value.get(step)
        else:
            value = _step(value, step, shown)
    return value


@dataclass(frozen=True)
class Path:
    text: str
    steps: tuple[Step, ...]
    cut: int = field(init=False)  # the fan-out step's position, -1 when none

    def __post_init__(self) -> None:
        object.__setattr__(self, "cut", self.steps.index(FAN_OUT) if FAN_OUT in self.steps else -1)

    @property
    def fans_out(self) -> bool:
        return self.cut >= 0

    def resolve(self, row: Any) -> Any:
        """The value, or for a fan-out path the list of values (one per element)."""
        if self.cut < 0:
            return _walk(row, self.steps, self.text)
        items = _walk(row, self.steps[: self.cut], self.text)
        if items is None:
            return None
        if not isinstance(items, list):
            raise PathError("path_through_scalar", f"{self.text}: fan-out over {type(items).__name__}, not a list")
        if not items:
            raise PathError("empty_fan_out", f"{self.text}: fan-out over an empty list")
        rest = self.steps[self.cut + 1 :]
        return [_walk(item, rest, self.text) for item in items]


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


@dataclass(frozen=True)
class Source:
    """One mapping value compiled: alternatives of paths, or a template."""

    text: str
    alternatives: tuple[Path, ...] = ()
    template: tuple[str | Path, ...] | None = None  # literal pieces and paths

    @property
    def fans_out(self) -> bool:
        return any(p.fans_out for p in self.paths())

    def paths(self) -> list[Path]:
        if self.template is not None:
            return [p for p in self.template if isinstance(p, Path)]
        return list(self.alternatives)

    def resolve(self, row: Any, sample_idx: int = 0) -> Any:
        if self.template is not None:
            return self._render(row, sample_idx)
        if len(self.alternatives) == 1:
            return self.alternatives[0].resolve(row)
        first_error: PathError | None = None
        for path in self.alternatives:
            try:
                value = path.resolve(row)
            except PathError as err:
                first_error = first_error or err
                continue
            if value is not None:
                return value
        if first_error is not None:
            raise first_error
        return None

    def _render(self, row: Any, sample_idx: int) -> str:
        out = []
        for piece in self.template or ():
            if isinstance(piece, str):
                out.append(piece)
                continue
            if piece.steps == (SAMPLE_IDX,) and not (isinstance(row, Mapping) and SAMPLE_IDX in row):
                value: Any = sample_idx
            else:
                value = piece.resolve(row)
            if value is None or isinstance(value, bool) or not isinstance(value, (str, int, float)):
                shown = "missing" if value is None else type(value).__name__
                raise PathError("template_field_missing", f"template {self.text!r}: {{{piece.text}}} is {shown}")
            out.append(str(value))
        return "".join(out)


def compile_source(text: str) -> Source:
    """A mapping value -> Source; PathSyntaxError names what is wrong (the caller names the field)."""
    if "{" in text or "}" in text:
        pieces: list[str | Path] = []
        pos = 0
        for match in _PLACEHOLDER.finditer(text):
            pieces.append(text[pos : match.start()])
            token = match.group(0)
            if token in ("{{", "}}"):
                pieces.append(token[0])
            else:
                inner = match.group(1)
                path = Path(inner.strip(), parse(inner))
                if path.fans_out:
                    raise PathSyntaxError(f"{{{inner}}} in template {text!r}: a template cannot fan out")
                pieces.append(path)
            pos = match.end()
        rest = text[pos:]
        if "{" in rest or "}" in rest:
            raise PathSyntaxError(f"unbalanced brace in template {text!r}")
        pieces.append(rest)
        return Source(text, template=tuple(p for p in pieces if p != ""))
    alternatives = tuple(Path(part.strip(), parse(part)) for part in text.split("|"))
    if len(alternatives) > 1 and any(p.fans_out for p in alternatives):
        raise PathSyntaxError(f"{text!r}: a fan-out cannot be one of several alternatives")
    return Source(text, alternatives=alternatives)
