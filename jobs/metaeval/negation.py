"""Rule-based sentence negation on a spaCy dependency parse (the EB-challenge NEG perturbation).

The main clause's verb is negated, the way CheckList's `Perturb.add_negation` does it, with the cases it
misses handled or refused explicitly: an existing negation is removed ("does not produce" -> "does produce"),
an auxiliary or modal takes "not" after it ("will have" -> "will not have"), a form of "be" takes "not"
after it, and a bare finite verb gets do-support ("produces" -> "does not produce"). A sentence without a
finite main verb returns None: the caller picks another step instead of writing an empty one.
"""

from __future__ import annotations

from typing import Any

_DO = {"VBZ": "does", "VBP": "do", "VBD": "did", "VB": "do"}


def _root(doc: Any) -> Any | None:
    for token in doc:
        if token.dep_ == "ROOT":
            return token
    return None


def _rebuild(doc: Any, replace: dict[int, str], drop: set[int]) -> str:
    parts = []
    for token in doc:
        if token.i in drop:
            continue
        parts.append(replace.get(token.i, token.text) + token.whitespace_)
    return "".join(parts).strip()


def negate_doc(doc: Any) -> str | None:
    """Negate a parsed sentence; None when no rule applies."""
    root = _root(doc)
    if root is None or root.pos_ not in ("VERB", "AUX"):
        return None
    negs = [c for c in root.children if c.dep_ == "neg"]
    if negs:
        return _rebuild(doc, {}, {negs[0].i})
    auxes = [c for c in root.children if c.dep_ in ("aux", "auxpass") and c.tag_ != "TO" and c.i < root.i]
    if auxes:
        first = auxes[0]
        return _rebuild(doc, {first.i: f"{first.text} not"}, set())
    if root.lemma_ == "be":
        return _rebuild(doc, {root.i: f"{root.text} not"}, set())
    do = _DO.get(root.tag_)
    if do is None:  # participles and gerunds without an auxiliary: no finite verb to negate
        return None
    if root.i == 0 or (root.i > 0 and doc[0].is_sent_start and root.text[:1].isupper()):
        do = do.capitalize() if root.text[:1].isupper() else do
    return _rebuild(doc, {root.i: f"{do} not {root.lemma_}"}, set())


def negate(text: str, nlp: Any) -> str | None:
    """Negate `text` with the spaCy pipeline `nlp`; None when it cannot be negated or nothing changes."""
    if not text or not text.strip():
        return None
    out = negate_doc(nlp(text))
    if not out or out == text.strip():
        return None
    return out
