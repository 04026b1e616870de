"""Step text -> Reasoning Content Units (RCUs): frame extraction, the official selection rules, roles.

Plain Python over spaCy docs (and, optionally, a token-classification SRL model); no Spark, no tables.
docs/design/RECEVAL.md "Reasoning Content Units" is the specification; the pieces:

- frames: `spacy_frames` (default: verb frames from the dependency parse) or `srl_frames` (any BIO-tagging
  token-classification model given by path: one pass per predicate, `B-V` marks the predicate);
- `select_rcus`: rules 1-6 of the official `get_phrases`, on whatever frames came out;
- `assign_roles`: `position` (official code: conclusion = last RCU) or `conjunction` (paper);
- sentence splitting for step boundaries and the context X; the a_hat rule (`derive_answer`).
Mathematics is hidden from spaCy before a step is parsed, and given back after, by udfs.rcu_math.
"""

from __future__ import annotations

import re
import string
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

_STRIP = string.punctuation + " "  # what the official code strips from phrases and left-overs
CONCLUSION_MARKERS = ("so", "therefore", "thus", "hence")
PREMISE_MARKERS = ("because", "since", "as", "given that")
# Connectives introduce a clause; SRL would tag them ARGM-DIS, docs/design/RECEVAL.md keeps them out of the frame text.
CONNECTIVES = frozenset({"so", "therefore", "thus", "hence", "because", "since"})
# Dependents that are frames of their own (as SRL would give them), kept out of the parent's span.
CLAUSAL_DEPS = frozenset({"advcl", "ccomp", "parataxis", "conj", "dep"})
# ARGM-like dependents of a predicate: the candidates of rule 2 (modifier removal).
MODIFIER_DEPS = frozenset({"prep", "advmod", "npadvmod", "agent"})
CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM-8K calculator annotations "<<3+4=7>>"

_NLP: dict[str, Any] = {}
_NLP_LOCK = threading.Lock()


@dataclass(frozen=True)
class Frame:
    """One predicate's phrase in a sentence: char range [start, end) and its ARGM-like sub-spans."""

    start: int
    end: int
    modifiers: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Rcu:
    text: str
    start: int  # char offset in the text the RCU was taken from (the step), for ordering and roles


# ---------------------------------------------------------------------------------------------- spaCy
def load_spacy(name: str) -> Any:
    """The spaCy pipeline, loaded once per Python worker (NER and lemmatizer are not needed here)."""
    with _NLP_LOCK:
        if name not in _NLP:
            import spacy

            _NLP[name] = spacy.load(name, exclude=["ner", "lemmatizer"])
        return _NLP[name]


def is_predicate(tok: Any) -> bool:
    """Verbs, and auxiliaries that head a clause (copulas); not auxiliaries attached to another verb."""
    return tok.pos_ == "VERB" or (tok.pos_ == "AUX" and tok.dep_ not in ("aux", "auxpass"))


def _is_verb_tag(tok: Any) -> bool:
    # The official code asks NLTK's PTB tagger for "VB*"; spaCy's English tag_ is the same tag set.
    return tok.tag_.startswith("VB") or tok.pos_ in ("VERB", "AUX")


def _edge_token(tok: Any, predicate: Any) -> bool:
    return tok.i != predicate.i and (
        tok.is_punct or tok.is_space or tok.dep_ in ("cc", "mark") or tok.lower_ in CONNECTIVES
    )


def spacy_frames(sent: Any) -> list[Frame]:
    """Verb frames of one spaCy sentence span; char offsets relative to `sent.start_char`."""
    base = sent.start_char
    frames: list[Frame] = []
    for pred in sent:
        if not is_predicate(pred):
            continue
        excluded: set[int] = set()
        for child in pred.children:
            if child.dep_ in CLAUSAL_DEPS and (child.dep_ not in ("conj", "dep") or is_predicate(child)):
                excluded.update(t.i for t in child.subtree)
            elif child.dep_ in ("cc", "mark"):
                excluded.add(child.i)
        for tok in pred.subtree:
            if tok.dep_ == "relcl" and tok.i != pred.i:
                excluded.update(t.i for t in tok.subtree)
        kept = [t for t in pred.subtree if t.i not in excluded and sent.start <= t.i < sent.end]
        # "A, so C": material left of a connective before the predicate belongs to another clause.
        cuts = [t.i for t in kept if t.i < pred.i and t.lower_ in CONNECTIVES]
        if cuts:
            kept = [t for t in kept if t.i > max(cuts)]
        while kept and _edge_token(kept[0], pred):
            kept.pop(0)
        while kept and _edge_token(kept[-1], pred):
            kept.pop()
        if not kept:
            continue
        start, end = kept[0].idx - base, kept[-1].idx + len(kept[-1].text) - base
        mods = []
        for child in pred.children:
            if child.dep_ in MODIFIER_DEPS and child.i not in excluded:
                sub = list(child.subtree)
                s, e = sub[0].idx - base, sub[-1].idx + len(sub[-1].text) - base
                if start <= s and e <= end:
                    mods.append((s, e))
        frames.append(Frame(start, end, tuple(mods)))
    return frames


def verb_checker(sent: Any) -> Callable[[int, int], bool]:
    """has_verb(start, end): does any token of `sent` inside this char range carry a verb tag."""
    base = sent.start_char
    spans = [(t.idx - base, t.idx - base + len(t.text)) for t in sent if _is_verb_tag(t)]

    def has_verb(start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in spans)

    return has_verb


# ---------------------------------------------------------------------------------------------- SRL
def frame_from_tags(tags: Sequence[str], offsets: Sequence[tuple[int, int]]) -> Frame | None:
    """BIO tags of one predicate's pass -> its frame (official `extract_frame` + ARGM modifiers).

    Continuation arguments (C-ARG*) are dropped; the span runs from the first B- tag to the last tagged word.
    """
    if len(set(tags)) <= 1:  # official: a pass that tags every word alike has no frame
        return None
    tags = ["O" if "C-ARG" in t else t for t in tags]
    first = next((i for i, t in enumerate(tags) if t.startswith("B-")), None)
    last = next((i for i in range(len(tags) - 1, -1, -1) if tags[i] != "O"), None)
    if first is None or last is None or last < first:
        return None
    mods: list[tuple[int, int]] = []
    i = 0
    while i < len(tags):
        if tags[i].startswith("B-ARGM"):
            role, j = tags[i][2:], i + 1
            while j < len(tags) and tags[j] == f"I-{role}":
                j += 1
            mods.append((offsets[i][0], offsets[j - 1][1]))
            i = j
        else:
            i += 1
    return Frame(offsets[first][0], offsets[last][1], tuple(mods))


def srl_frames(sent: Any, model: Any, tokenizer: Any, max_length: int = 512) -> list[Frame]:
    """Frames from a token-classification SRL model: one pass per predicate candidate.

    Input convention (AllenNLP BERT SRL): the sentence's words as the first sequence, the predicate word as
    the second; a word's tag is the label of its first sub-token. Labels are read from `config.id2label`.
    """
    import torch

    words = [t.text for t in sent]
    preds = [t for t in sent if is_predicate(t)]
    if not words or not preds:
        return []
    base = sent.start_char
    offsets = [(t.idx - base, t.idx - base + len(t.text)) for t in sent]
    enc = tokenizer(
        [words] * len(preds),
        [[p.text] for p in preds],
        is_split_into_words=True,
        truncation="only_first",
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
    labels = logits.argmax(-1).cpu().tolist()
    id2label = model.config.id2label
    frames = []
    for row, ids in enumerate(labels):
        tags = ["O"] * len(words)
        seen: set[int] = set()
        seq = enc.sequence_ids(row)
        for pos, word in enumerate(enc.word_ids(row)):
            if word is not None and seq[pos] == 0 and word not in seen:
                seen.add(word)
                tags[word] = str(id2label[ids[pos]])
        frame = frame_from_tags(tags, offsets)
        if frame is not None:
            frames.append(frame)
    return frames


# ---------------------------------------------------------------------------------------------- rules
def _clean_phrase(text: str) -> str:
    return text.strip().rstrip(".").strip()


def select_rcus(sentence: str, frames: Iterable[Frame], has_verb: Callable[[int, int], bool]) -> list[Rcu]:
    """Rules 1-6 of docs/design/RECEVAL.md on one sentence's frames; RCU offsets are relative to `sentence`."""
    lead = len(sentence) - len(sentence.lstrip())
    mod_sent = sentence.strip().rstrip(".")
    phrases: list[tuple[str, int]] = []
    for fr in frames:  # rule 1: one phrase per frame
        raw = sentence[fr.start : fr.end]
        phrase = _clean_phrase(raw)
        pos = fr.start + (len(raw) - len(raw.lstrip()))
        if phrase == mod_sent:  # rule 2: a whole-sentence frame loses its verb-bearing modifiers
            for s, e in fr.modifiers:
                mod = sentence[s:e].strip()
                if len(mod.split()) > 2 and has_verb(s, e):
                    phrase = re.sub(" +", " ", phrase.replace(mod, "")).strip(_STRIP)
        if phrase:
            phrases.append((phrase, pos))
    phrases.sort(key=lambda p: len(p[0]), reverse=True)  # rule 3: longest first, stable
    kept: list[tuple[str, int]] = []
    history = ""
    for phrase, pos in phrases:
        if phrase not in history:
            history += " " + phrase
            kept.append((phrase, pos))
    if not kept:  # rule 6
        return [Rcu(mod_sent, lead)] if mod_sent else []
    kept.sort(key=lambda p: p[1])  # rule 4
    left = mod_sent
    for phrase, _ in kept:
        left = left.replace(phrase, "#").strip(_STRIP)
    joined = " ".join(p for p, _ in kept)
    extra = []
    for piece in left.split("#"):  # rule 5: left-overs of >= 4 words with a verb
        piece = piece.strip(_STRIP)
        if len(piece.split()) >= 4 and piece not in joined:
            at = sentence.find(piece)
            if at >= 0 and has_verb(at, at + len(piece)):
                extra.append((piece, at))
    if extra:
        kept = sorted(kept + extra, key=lambda p: p[1])
    return [Rcu(p, pos) for p, pos in kept]


def _marker_positions(text: str) -> list[tuple[int, str]]:
    """(char offset, "conclusion" | "premise") of the connectives in a step, in order."""
    found: list[tuple[int, str]] = []
    for word in CONCLUSION_MARKERS:
        # "so many/much/far" (degree) do not introduce a conclusion ("so that", purpose, is left to the extractor:
        # only the text between units is read, and a unit keeps a purpose "so that" inside it).
        pattern = r"\bso\b(?!\s+(?:many|much|far)\b)" if word == "so" else rf"\b{word}\b"
        found += [(m.start(), "conclusion") for m in re.finditer(pattern, text, re.IGNORECASE)]
    for pattern in (r"\bas a result\b", r"\b(?:which|that|this) means\b", r"\bconsequently\b"):
        found += [(m.start(), "conclusion") for m in re.finditer(pattern, text, re.IGNORECASE)]
    for word in PREMISE_MARKERS:
        # "as" only opening a clause (start or after a comma): "as much as", "such as", "as a result" are not premises.
        pattern = r"(?:^|(?<=,\s))as\b(?!\s+a\s+result\b)" if word == "as" else rf"\b{word}\b"
        found += [(m.start(), "premise") for m in re.finditer(pattern, text, re.IGNORECASE)]
    return sorted(found)


# What stands between two units that together make one conclusion ("so A and B", "so A, B"): a coordinator or a
# comma. Units that merely touch (a verb frame cut out of its clause, "that means" + "Kylar is going to buy ...")
# are not joined.
_JOINABLE_GAP = re.compile(r"^\s*(?:,\s*(?:(?:and|but|or)\s+)?|(?:and|but|or)\s+)$", re.IGNORECASE)


def assign_roles(units: Sequence[Rcu], step_text: str, rule: str) -> tuple[list[str], str]:
    """(premise RCUs, conclusion RCU) of one step.

    position: conclusion = the last RCU, premises = the others (official code; misreads "C because P").
    conjunction (paper; default): a unit takes the kind of the last connective in the text between the previous
    unit's end and its own start ("so" / "therefore" / "thus" / "hence" / "as a result" / "which means":
    conclusion; "because" / "since" / clause-opening "as" / "given that": premise). A unit with none there
    inherits "conclusion" from the previous unit ("so A and B": both concluded), and "premise" only across a
    coordinator ("because P1 and P2"), not across a comma ("since P, C": C is not a premise). The conclusion is
    the last run of concluded units joined by at most a coordinator, as one span of the step ("so A and B" ->
    "A and B"); without a concluded unit, the last unit not introduced by a premise marker ("C because P" -> C);
    without that either, the last unit. Every other unit is a premise, in order.
    """
    if not units:
        return [], ""
    idx = len(units) - 1
    if rule == "conjunction":
        markers = _marker_positions(step_text)
        roles: list[str | None] = []
        prev_end = -1
        for unit in units:
            between = [kind for at, kind in markers if prev_end <= at <= unit.start]
            gap = step_text[max(prev_end, 0) : unit.start]
            if between:
                roles.append(between[-1])
            elif roles and roles[-1] == "conclusion":
                roles.append("conclusion")
            elif roles and roles[-1] == "premise" and re.search(r"\b(?:and|or)\b", gap, re.IGNORECASE):
                roles.append("premise")
            else:
                roles.append(None)
            prev_end = max(prev_end, unit.start + len(unit.text))
        concl = [i for i, r in enumerate(roles) if r == "conclusion"]
        if concl:
            last = concl[-1]
            first = last
            while first - 1 in concl and _JOINABLE_GAP.match(
                step_text[units[first - 1].start + len(units[first - 1].text) : units[first].start]
            ):
                first -= 1
            if first < last:
                span = step_text[units[first].start : units[last].start + len(units[last].text)]
                rest = [u.text for i, u in enumerate(units) if not first <= i <= last]
                return rest, span
            idx = last
        else:
            free = [i for i, r in enumerate(roles) if r is None]
            idx = free[-1] if free else idx
    elif rule != "position":
        raise ValueError(f"unknown role rule {rule!r} (position | conjunction)")
    return [u.text for i, u in enumerate(units) if i != idx], units[idx].text


# ---------------------------------------------------------------------------------------------- text
def clean_text(text: str, strip_calculator: bool = True) -> str:
    return CALCULATOR.sub("", text) if strip_calculator else text


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


def paragraphs(text: str) -> list[str]:
    """Blocks of text between blank lines, each stripped (its own line breaks kept); empty blocks dropped."""
    return [block.strip() for block in _BLANK_LINE.split(text.replace("\r\n", "\n")) if block.strip()]


def sentence_spans(doc: Any) -> list[Any]:
    """Non-empty sentence spans of a doc (whitespace-only "sentences" dropped)."""
    return [s for s in doc.sents if s.text.strip()]


def rcus_of(doc_or_span: Any, frames_of: Callable[[Any], list[Frame]]) -> list[Rcu]:
    """RCUs of a step (a doc or span): per sentence, offsets relative to the step's start."""
    base = doc_or_span.start_char if hasattr(doc_or_span, "start_char") else 0
    sents = list(doc_or_span.sents) if hasattr(doc_or_span, "sents") else [doc_or_span]
    out: list[Rcu] = []
    for sent in sents:
        if not sent.text.strip():
            continue
        units = select_rcus(sent.text, frames_of(sent), verb_checker(sent))
        shift = sent.start_char - base
        out += [Rcu(u.text, u.start + shift) for u in units]
    return out


def derive_answer(
    given: str | None,
    chain_text: str,
    last_conclusion: str | None,
    indicators: Sequence[str] = ("answer is", "[ANSWER]"),
) -> tuple[str | None, str]:
    """a_hat and the rule that produced it: given | indicator | last_conclusion.

    indicator: the text after the LAST occurrence of any indicator (case-insensitive) up to the end of its
    line, without a leading ':' and trailing '.'; an indicator followed by nothing does not count.
    """
    if given is not None and given.strip():
        return given, "given"
    best: tuple[int, str] | None = None
    lowered = chain_text.lower()
    for ind in indicators:
        at = lowered.rfind(ind.lower())
        if at >= 0 and (best is None or at > best[0]):
            best = (at, ind)
    if best is not None:
        rest = chain_text[best[0] + len(best[1]) :].split("\n", 1)[0]
        value = rest.strip().lstrip(":").strip().rstrip(".").strip()
        if value:
            return value, "indicator"
    return last_conclusion, "last_conclusion"
