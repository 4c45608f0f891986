"""Secrets out of what hrl writes: a `Redactor` replaces host secrets in text and in JSON-like objects.

An agent is untrusted code and a trace is shared freely, so neither may carry the host's secrets. A redactor knows:

- the values of the host's secret-looking environment variables (`Redactor.from_env(os.environ)`): a variable
  counts when a `_`-separated part of its name ends with one of SECRET_WORDS (`OPENAI_API_KEY`, `HF_TOKEN`,
  `PGPASSWORD`, `AWS_SESSION_TOKEN`, `GITHUB_PAT`; not `KEYBOARD`, `TOKENIZERS_PARALLELISM`, `GIT_AUTHOR_NAME`)
  and its value could be a secret: at least MIN_SECRET_CHARS characters, not a path (`/…`, `~…`, `./…`, a list of
  paths), not a number or a boolean, not one of hrl's own `hrl-<token>` session keys (those name a session to the
  proxy; they are no host secret). Each is replaced by `[REDACTED:env:NAME]`, wherever it occurs.
- known key formats, whatever their source (`[REDACTED:<kind>]`, kinds in KINDS): OpenAI `sk-…` (and `sk-proj-…`),
  Anthropic `sk-ant-…`, Hugging Face `hf_…`, AWS access key ids `AKIA…`/`ASIA…` and `aws_secret_access_key = …` /
  `aws_session_token = …` values, GitHub `ghp_/gho_/ghu_/ghs_/ghr_…` and `github_pat_…`, Slack `xox[baprs]-…`,
  Google `AIza…`, `Bearer <token>` (not `Bearer hrl-…`), the password of `scheme://user:password@host` URLs, and PEM
  private key blocks. The patterns demand a token's length and alphabet (and, for `sk-`, a digit) so that words
  and identifiers (`hf_hub_download`, `sk-learn`, `task-…`) stay as they are.

Speed: in a long text, each env value is looked for by substring search (C, hundreds of MB/s for a random
token) and the key formats by one regex whose every alternative starts with a literal character, so the engine
skips in C to the positions holding one of those; a short string goes through one regex of both. `obj` walks
dicts, lists and tuples, redacts every string (keys too), and returns lists of numbers as they are, without a
Python loop over their elements. Measured by bench/redact_speed.py.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["KINDS", "LONG_TEXT", "MIN_SECRET_CHARS", "SECRET_WORDS", "Redactor", "default_redactor", "is_secret_name"]

MIN_SECRET_CHARS = 8
LONG_TEXT = 4096  # from this length on, env values are found by substring search (see Speed)
SECRET_WORDS = (
    "KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PAT", "CREDENTIAL", "AUTH", "COOKIE", "SESSION", "PRIVATE",
)  # fmt: skip
_NAME = re.compile(rf"(?:^|_)[A-Z0-9]*(?:{'|'.join(SECRET_WORDS)})S?(?:_|$)", re.IGNORECASE)
# Names that match a secret word but hold desktop-session plumbing, never a secret.
NOT_SECRET = frozenset(
    {"SSH_AUTH_SOCK", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_SESSION_DESKTOP", "XDG_SESSION_ID",
     "DESKTOP_SESSION", "DBUS_SESSION_BUS_ADDRESS", "SESSION_MANAGER"}
)  # fmt: skip
_NOT_A_SECRET_VALUE = re.compile(
    r"(?i)(?:true|false|yes|no|on|off|none|null|[-+]?\d+(?:\.\d+)?|"  # booleans, numbers
    r"(?:(?:~|\.{1,2})?/[^:]*)(?::(?:~|\.{1,2})?/[^:]*)*)"  # a path, or a :-separated list of paths
)
_W = "A-Za-z0-9_"  # word characters: a token must not start or end inside a longer word
_TOKEN = r"[A-Za-z0-9_-]"


def _word(prefix: str, rest: str, *, end: bool = False) -> str:
    """`prefix` + `rest`, not preceded by a word character (`end`: nor followed by one). The lookbehind comes after
    the first character, so the pattern still starts with a literal one (see Speed)."""
    first = re.escape(prefix[0])
    tail = f"(?![{_W}])" if end else ""
    return f"{first}(?<![{_W}]{first}){re.escape(prefix[1:])}{rest}{tail}"


def _cases(word: str) -> list[str]:
    return list(dict.fromkeys([word.lower(), word.upper(), word[:1].upper() + word[1:].lower()]))


# (kind, alternatives); a `(?P<v>…)` group marks the part to replace (default: the whole match).
KINDS: tuple[tuple[str, list[str]], ...] = (
    ("private-key", [r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----[\s\S]*?(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----|\Z)"]),
    ("anthropic-key", [_word("sk-ant-", f"{_TOKEN}{{20,}}")]),
    ("openai-key", [_word("sk-", f"(?:proj-|svcacct-|admin-)?(?={_TOKEN}{{0,300}}[0-9]){_TOKEN}{{20,}}")]),
    ("huggingface-token", [_word("hf_", "[A-Za-z0-9]{30,}", end=True)]),
    ("aws-access-key-id", [_word(p, "[A-Z0-9]{16}", end=True) for p in ("AKIA", "ASIA")]),
    ("aws-secret", [_word(w, r"[\"']?\s*[:=]\s*[\"']?(?P<v>[A-Za-z0-9/+=]{40,})")
                    for name in ("aws_secret_access_key", "aws_session_token") for w in _cases(name)]),
    ("github-token", [*(_word(f"gh{c}_", "[A-Za-z0-9]{36,}", end=True) for c in "pousr"),
                      _word("github_pat_", "[A-Za-z0-9_]{22,}")]),
    ("slack-token", [_word(f"xox{c}-", "[A-Za-z0-9-]{10,}") for c in "baprs"]),
    ("google-api-key", [_word("AIza", "[0-9A-Za-z_-]{35}", end=True)]),
    ("bearer-token", [_word(w, r"\s+(?!hrl-)(?P<v>[A-Za-z0-9._~+/=-]{16,})") for w in _cases("bearer")]),
    ("url-password", [r"://[^\s/:@\"'<>]{1,256}:(?P<v>[^\s/@\"'<>]{1,256})@"]),
)  # fmt: skip


def is_secret_name(name: str) -> bool:
    """Does this environment variable's name say it holds a secret?"""
    return name.upper() not in NOT_SECRET and _NAME.search(name) is not None


def _secret_value(value: str) -> bool:
    return (
        len(value) >= MIN_SECRET_CHARS
        and not value.startswith("hrl-")
        and _NOT_A_SECRET_VALUE.fullmatch(value.strip()) is None
    )


class Redactor:
    """Replaces secrets in strings and JSON-like objects. `secrets`: {name: value}, each value redacted verbatim
    as `[REDACTED:env:NAME]` (no filtering here: `from_env` filters); `known_formats`: also the patterns of KINDS."""

    def __init__(self, secrets: Mapping[str, str] | None = None, *, known_formats: bool = True) -> None:
        by_value: dict[str, str] = {}
        for name, value in (secrets or {}).items():
            if value:
                by_value.setdefault(value, name)
        self.names = tuple(sorted(set(by_value.values())))  # the env variables whose values are redacted
        # env values longest first (one may hold another), then the key formats; each alternative of a regex ends
        # in a marker group that names it (the last group to close), so a match knows its label
        self._env = [(v, f"[REDACTED:env:{by_value[v]}]") for v in sorted(by_value, key=len, reverse=True)]
        self._labels: dict[str, tuple[str, bool]] = {}  # marker group -> (tag, has a value group)
        env = [self._marked(re.escape(v), tag) for v, tag in self._env]
        kinds = [self._marked(p, f"[REDACTED:{kind}]") for kind, alts in (KINDS if known_formats else ()) for p in alts]
        self._regex = re.compile("|".join(env + kinds)) if env or kinds else None  # for short strings
        self._kinds = re.compile("|".join(kinds)) if kinds else None  # for long ones, with the env values found apart

    def _marked(self, pattern: str, tag: str) -> str:
        group = f"a{len(self._labels)}"
        self._labels[group] = (tag, "(?P<v>" in pattern)
        return pattern.replace("(?P<v>", f"(?P<v{group}>") + f"(?P<{group}>)"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, known_formats: bool = True) -> Redactor:
        """A redactor for the secret-looking variables of `env` (default: os.environ); see the module docstring."""
        env = os.environ if env is None else env
        return cls(
            {k: v for k, v in env.items() if is_secret_name(k) and _secret_value(v)}, known_formats=known_formats
        )

    def text(self, s: str) -> str:
        """`s` with every secret replaced by `[REDACTED:…]`."""
        if self._regex is None:
            return s
        if len(s) < LONG_TEXT:
            return self._regex.sub(self._replace, s)
        parts, at = [], 0
        for start, end, tag in self._spans(s):
            parts += [s[at:start], tag]
            at = end
        return "".join([*parts, s[at:]]) if parts else s

    def found(self, s: str) -> bool:
        """Does `s` hold a secret?"""
        if self._regex is None:
            return False
        if len(s) < LONG_TEXT:
            return self._regex.search(s) is not None
        return any(v in s for v, _ in self._env) or (self._kinds is not None and self._kinds.search(s) is not None)

    def obj(self, o: Any) -> Any:
        """A copy of a JSON-like object (dicts, lists, tuples, scalars) with every string redacted, keys included;
        numbers, booleans, None and lists of numbers come back as they are (the same objects). Fit for a list of
        chat messages ({role, content: str | [parts], tool_calls: [{function: {name, arguments}}]})."""
        return o if self._regex is None else self._obj(o)

    def _obj(self, o: Any) -> Any:
        if isinstance(o, str):
            return self.text(o)
        if isinstance(o, dict):
            return {self.text(k) if isinstance(k, str) else k: self._obj(v) for k, v in o.items()}
        if isinstance(o, list | tuple):
            if o and set(map(type, o)) <= _NUMBERS:  # token ids, logprobs: one pass in C
                return o
            items = [self._obj(v) for v in o]
            return tuple(items) if isinstance(o, tuple) else items
        return o

    def _replace(self, m: re.Match[str]) -> str:
        group = m.lastgroup or ""
        tag, has_value = self._labels[group]
        if not has_value:
            return tag
        start, end = m.span(f"v{group}")
        return m.string[m.start() : start] + tag + m.string[end : m.end()]

    def _spans(self, s: str) -> list[tuple[int, int, str]]:
        """(start, end, replacement) of what the combined regex would replace in `s`, found faster: each env value
        by substring search, the key formats by their own regex; overlaps are settled as one regex would settle
        them (the leftmost match wins; at one position, the env value listed first)."""
        found = [(i, k, i + len(v), tag) for k, (v, tag) in enumerate(self._env) for i in _finds(s, v)]
        if self._kinds is not None:
            found += [(m.start(), len(self._env), m.end(), self._replace(m)) for m in self._kinds.finditer(s)]
        found.sort(key=lambda row: row[:2])
        kept: list[tuple[int, int, str]] = []
        for start, _, end, tag in found:
            if not kept or start >= kept[-1][1]:
                kept.append((start, end, tag))
        return kept


_NUMBERS = {int, float, bool}


def _finds(s: str, needle: str) -> Iterator[int]:
    i = s.find(needle)
    while i != -1:
        yield i
        i = s.find(needle, i + 1)


@functools.cache
def default_redactor() -> Redactor:
    """The process's redactor: built once from os.environ as it was at first use."""
    return Redactor.from_env(os.environ)
