"""A text's tokens, tokenized only as far as they are asked for.

A reader that may stop after two chunks of a long document should not pay for
tokenizing all of it (4-5 us a token with multilingual-e5's tokenizer: 20 ms for a
4,700-token document, more than its two chunks' cheap stages). So a text is tokenized
in pieces cut at single spaces, each piece about as long as the tokens still wanted;
:func:`piecewise` checks once per tokenizer that this gives the whole text's tokens.

>>> from tokenizers import Tokenizer, models, pre_tokenizers
>>> tok = Tokenizer(models.WordLevel({"[UNK]": 0, "w": 1}, "[UNK]"))
>>> tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
>>> piecewise(tok)
True
>>> t = TextTokens(" ".join(["w"] * 10_000))
>>> t.ensure(10, tok)
>>> 10 < len(t.ids) < 1000, t.complete
(True, False)
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from tokenizers import Encoding, Tokenizer

# A cut between pieces: one space with text on both sides. Every pre-tokenizer kascade
# meets (BERT's, Metaspace, byte-level BPE) starts a token there, so a text tokenized
# piece by piece gives the whole text's tokens; :func:`piecewise` checks it per tokenizer.
_CUT = re.compile(r"(?<=\S) (?=\S)")
_PROBE = (
    "The Bank's 3rd-quarter results (Q3) beat forecasts: revenue rose 12.5% to $4.2bn."
    " Der Bürgermeister sagte, dass die Straße gesperrt wird. L'équipe a gagné 2-1 hier"
    " soir! Москва объявила о новых мерах. 東京で新しい駅が開業した。 北京 今天 下雨。"  # noqa: RUF001
    " وقال الوزير إن المحادثات مستمرة. हिंदी में समाचार पढ़ें। ภาษาไทย ไม่มีช่องว่าง"
    " naïve café résumé   spaced\twords\nnew line x, y; z... «quotes» — dash 👍 ok"
)


@functools.cache
def piecewise(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` gives a text's tokens (ids and offsets) when the text is
    tokenized in pieces cut at single spaces; where not, texts are tokenized whole."""
    whole = tokenizer.encode(_PROBE, add_special_tokens=False)
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    a = 0
    for c in [m.start() for m in _CUT.finditer(_PROBE)] + [len(_PROBE)]:
        part = tokenizer.encode(_PROBE[a:c], add_special_tokens=False)
        ids += part.ids
        offsets += [(x + a, y + a) for x, y in part.offsets]
        a = c
    return ids == whole.ids and offsets == whole.offsets


def _cut(text: str, start: int, want: int) -> int:
    """Where the piece of ``text`` from ``start`` ends: at the last cut before ``start +
    want`` characters, else the first after it, else the end of the text."""
    if start + want >= len(text):
        return len(text)
    i = text.rfind(" ", start + 1, start + want)
    while i > start:
        if not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", start + 1, i)
    m = _CUT.search(text, start + want)
    return len(text) if m is None else m.start()


@dataclass
class TextTokens:
    """A text's tokens, tokenized only as far as they are asked for (plain data: it is
    part of a document's recovery state; the tokenizer is passed in)."""

    text: str
    ids: list[int] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    done_chars: int = 0  # the text before this is tokenized

    @property
    def complete(self) -> bool:
        return self.done_chars >= len(self.text)

    def ensure(self, n: int | None, tokenizer: Tokenizer, whole: bool = False) -> None:
        """Tokenize on until there are more than ``n`` tokens (``None``: to the end) or
        the text is done; ``whole``: the rest in one piece (for a tokenizer
        :func:`piecewise` refused)."""
        while (n is None or len(self.ids) <= n) and not self.complete:
            start = self.done_chars
            if whole or n is None:
                end = len(self.text)
            else:
                # Characters per token so far (4 before any) estimate the piece that gives
                # the tokens still wanted, with a margin so that one piece mostly does.
                per = (start / len(self.ids)) if self.ids else 4.0
                end = _cut(self.text, start, max(256, int((n + 1 - len(self.ids)) * per * 1.25)))
            part = tokens_of(tokenizer, self.text[start:end])
            self.ids += part.ids
            self.offsets += [(x + start, y + start) for x, y in part.offsets]
            self.done_chars = end


def tokens_of(tokenizer: Tokenizer, text: str) -> Encoding:
    """One piece of a text, tokenized without special tokens."""
    return tokenizer.encode(text, add_special_tokens=False)
