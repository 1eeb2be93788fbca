"""Secrets kept out of run files: the one rule every stored command line (argv) goes through.

A run file is shared (copied to a laptop, attached to an issue, read by other users of a node),
so the values of options that carry secrets are replaced by ``***`` before a command is stored:
the run's command, every process's ``sys.argv``, the commands events carry. The training itself
still sees its arguments unchanged; only the stored copy is redacted. The environment is never
stored at all.

The rule (docs/reference.md, "Secrets in the command line"):

* An option's *name* is the text after its leading dash(es) and before any ``=``: ``--api-key``,
  ``-token``, ``--hf_token=...``; and, for an argument ``NAME=VALUE`` without dashes (Hydra's
  ``wandb.api_key=...``, ``env HF_TOKEN=...``), the ``NAME``. A name is split into words at
  ``-``, ``_``, ``.``, digits and camelCase (``apiKey``: api, key).
* The name is a secret's when its **last word** is one of key, token, secret(s), password(s),
  passwd, auth, authorization, credential(s), cookie(s), or ends with one (``apikey``,
  ``authtoken``, ``oauth``). The plurals ``keys`` and ``tokens`` are counts, not secrets:
  ``--max-tokens 512``, ``--num-keys 4`` stay; so do ``--tokenizer gpt2``, ``--key-dim 64``,
  ``--token-file PATH`` (the last word is not a secret's).
* Its value is replaced: ``--api-key=***``, ``--token ***`` (the next argument, unless it looks
  like an option itself: ``-x`` that is not a negative number), ``wandb.api_key=***``. An empty
  value stays empty.
* Any ``--redact PATTERN`` (a regular expression, case-insensitive) found anywhere in a name
  (``re.search``) makes it a secret's too: ``--redact dsn`` hides ``--db-dsn VALUE``.
* In every argument, the user information of a URL is replaced, the host kept:
  ``https://user:pass@host/x`` -> ``https://***@host/x``.

Standard library only: the agent applies it inside the training process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

MASK = "***"
# a word of an option's name that says its value is a secret (the last word, or its end)
_SECRET_WORD = re.compile(r".*(key|token|secrets?|passwords?|passwd|auth|authorization|"
                          r"credentials?|cookies?)")
# words of a name: camelCase humps, acronyms, lower-case runs (digits and punctuation split)
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")
# NAME=VALUE without dashes: a dotted identifier (Hydra's ``+a.b=...``, ``~a``, an env assignment)
_ASSIGNMENT = re.compile(r"([+~]{0,2}[A-Za-z_][\w.\-]*)=(.*)", re.DOTALL)
_OPTION = re.compile(r"(--?)([A-Za-z_][\w.\-]*)(?:=(.*))?", re.DOTALL)
# scheme://userinfo@ : everything up to the last @ before the host (a password may hold an @)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")
_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+([eE][-+]?\d+)?")


@dataclass(frozen=True)
class Redaction:
    """How a command line is stored: redacted by the rule (plus ``patterns``), or kept whole
    (``enabled=False``: ``memscope attach --no-redact``, ``memscope.start(redact=False)``)."""

    enabled: bool = True
    patterns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for p in self.patterns:
            check_pattern(p)

    @classmethod
    def from_options(cls, options: Any) -> "Redaction":
        """From an object with ``redact`` and ``redact_patterns`` (the agent's options)."""
        return cls(bool(getattr(options, "redact", True)),
                   tuple(getattr(options, "redact_patterns", None) or ()))

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as it is stored: a new list, the input unchanged."""
        words = [str(a) for a in argv]
        if not self.enabled:
            return words
        extra = [re.compile(p, re.IGNORECASE) for p in self.patterns]
        out: list[str] = []
        hide_next = False
        for arg in words:
            if hide_next and arg and not _looks_like_option(arg):
                out.append(MASK)
                hide_next = False
                continue
            hide_next = False
            option = _OPTION.fullmatch(arg)
            if option is not None:
                dashes, name, value = option.groups()
                if self._secret(name, extra):
                    if value is None:
                        hide_next = True
                        out.append(arg)
                    else:
                        out.append(f"{dashes}{name}={MASK if value else ''}")
                    continue
            else:
                assignment = _ASSIGNMENT.fullmatch(arg)
                if assignment is not None and self._secret(assignment.group(1), extra):
                    out.append(f"{assignment.group(1)}={MASK if assignment.group(2) else ''}")
                    continue
            out.append(redact_urls(arg))
        return out

    def _secret(self, name: str, extra: list[re.Pattern[str]]) -> bool:
        return is_secret_name(name) or any(p.search(name.lstrip("+~")) for p in extra)


DEFAULT = Redaction()


def redact_argv(argv: Sequence[str], patterns: Sequence[str] = (), enabled: bool = True) -> list[str]:
    """``argv`` as a run file stores it (see the module's doc for the rule)."""
    return Redaction(enabled, tuple(patterns)).argv(argv)


def is_secret_name(name: str) -> bool:
    """Whether an option named ``name`` (``api-key``, ``hf_token``, ``wandb.apiKey``) carries a
    secret by the built-in rule: its last word is a secret's word."""
    words = _WORDS.findall(name)
    return bool(words) and _SECRET_WORD.fullmatch(words[-1].lower()) is not None


def redact_urls(text: str) -> str:
    """``scheme://user:pass@host`` -> ``scheme://***@host``, anywhere in ``text``."""
    if "://" not in text:
        return text
    return _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)


def check_pattern(pattern: str) -> None:
    """Raise ValueError (one line) unless ``pattern`` is a regular expression."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"a redaction pattern must be a non-empty regular expression, not {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"redaction pattern {pattern!r} is not a regular expression ({exc})") from None


def _looks_like_option(arg: str) -> bool:
    """As argparse sees it: ``-x`` or ``--x`` is an option, ``-1`` and ``-0.5`` are values."""
    return arg.startswith("-") and len(arg) > 1 and _NUMBER.fullmatch(arg) is None
