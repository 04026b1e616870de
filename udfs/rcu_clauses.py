"""Step text -> clause units: the default RCU extractor (`steps.extractor=clauses`), on a spaCy parse.

docs/design/RECEVAL.md "Clause units" is the specification. A step is cut into contiguous units at discourse
connectives (so, thus, therefore, hence, because, since, as a result, which/that/this means) and between
coordinated clauses that each have their own subject and verb; nothing else is cut: copular sentences, lists,
verbs sharing one subject, relative clauses and conditional or temporal sentences ("if P, then Q", "when P, Q")
stay whole, and an equation without a verb ("3 * 4 = 12") is a unit. Units never start or end with a connective,
a coordinator or a comma. Compared with the verb frames of `udfs.rcu` (an emulation of the paper's SRL frames),
this is what agrees with EntailmentBank's gold structure and a hand-labelled GSM-8K set (bench/RESULTS.md):
frames split "dark is a kind of color and light is a kind of color" inside its second clause.

Plain Python over spaCy tokens (tag_, dep_, head): no Spark, no model beyond the parser. Linear in the tokens
of a sentence except subordinate clauses, whose extent is the subtree of their verb.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from udfs.rcu import Rcu

_FINITE = frozenset({"VBZ", "VBP", "VBD", "MD"})
# Adverbs that are connectives only where a clause begins ("Thus, ..."); mid-clause they stay in the unit
# ("She therefore still needs ...").
_BOUNDARY_CONNECTIVES = frozenset({"thus", "therefore", "hence", "consequently"})
_COORDINATORS = frozenset({"and", "but", "or"})
# Subordinators whose clause belongs to the claim it modifies ("if P, then Q", "when P, Q", "as distance
# decreases, the pull increases"): kept whole, as EntailmentBank's gold facts are one unit.
_SUBORDINATORS = frozenset(
    {"if", "when", "whenever", "after", "before", "while", "although", "though", "once", "unless", "until", "as"}
)
# "so" as a degree or purpose word, not a conclusion: "so many", "so far", "and so on".
_SO_NOT_BEFORE = frozenset({"many", "much", "far", "long", "few", "little", "on", "called"})
_SO_NOT_AFTER = frozenset({"or", "do", "did", "does", "doing", "not", "think"})
# Words that may open a clause before its subject ("and then he ...", "but only 36 of them are ...").
_OPENERS = frozenset(
    {"then", "also", "first", "next", "now", "finally", "only", "so", "lastly", "second", "third", "fourth", "fifth",
     "additionally", "however"}
)


def _is_equation_token(tok: Any) -> bool:
    return "=" in tok.text  # spaCy keeps "2=17" as one token


def _at_clause_start(toks: Sequence[Any], i: int) -> bool:
    """Token i opens a clause: the sentence's first token, or after punctuation, a coordinator or "so"."""
    return i == 0 or toks[i - 1].is_punct or toks[i - 1].lower_ in _COORDINATORS or toks[i - 1].lower_ == "so"


def _verb_before_break(toks: Sequence[Any], i: int) -> bool:
    """A verb or an equation between token i and the next ,;: or the end ("since 2010," introduces no clause)."""
    for t in toks[i + 1 :]:
        if t.text in (",", ";", ":"):
            return False
        if t.tag_.startswith("VB") or t.tag_ == "MD" or _is_equation_token(t):
            return True
    return False


def connective(toks: Sequence[Any], i: int) -> tuple[int, str] | None:
    """(number of tokens, "conclusion" | "premise") when token i opens a discourse connective, else None."""
    word = toks[i].lower_
    nxt = toks[i + 1].lower_ if i + 1 < len(toks) else None
    after = toks[i + 2].lower_ if i + 2 < len(toks) else None
    if word == "so":
        if nxt is None or (toks[i + 1].is_punct and nxt != ",") or nxt in _SO_NOT_BEFORE or (i > 0 and toks[i - 1].lower_ in _SO_NOT_AFTER):
            return None
        if i > 0 and toks[i - 1].text == ",":
            return 1, "conclusion"  # ", so": the official EB rendering, and how a conclusion is mostly written
        if nxt == "that" and any(t.tag_ == "MD" for t in toks[i + 2 : i + 6]):
            return None  # purpose: "so that he can"
        if toks[i + 1].tag_ in ("JJ", "RB") and toks[i].head.i == toks[i + 1].i:
            return None  # degree: "so big", "so quickly"
        return 1, "conclusion"
    if word == "because":
        return None if nxt == "of" else (1, "premise")
    if word == "since":
        return (1, "premise") if _verb_before_break(toks, i) else None
    if word == "as" and nxt == "a" and after == "result":
        return 3, "conclusion"
    if word in _BOUNDARY_CONNECTIVES and _at_clause_start(toks, i):
        return 1, "conclusion"
    if word in ("which", "that", "this") and nxt == "means" and toks[i + 1].tag_ == "VBZ":
        # "which means that they ...": the complementizer goes with the connective
        return (3 if after == "that" and i + 3 < len(toks) else 2), "conclusion"
    return None


def _zone_end(toks: Sequence[Any], i: int, connectives: Sequence[int]) -> int:
    """Last token of the subordinate clause opened at i, with the comma and "then" that close it.

    Clipped before the next connective: a parse that hangs the main clause under the subordinate one must not
    swallow "..., so C".
    """
    limit = min([c for c in connectives if c > i], default=len(toks)) - 1
    if toks[i].lower_ == "if":  # "if P(,) then Q": the antecedent runs up to "then", whatever the parse says
        for j in range(i + 1, limit + 1):
            if toks[j].lower_ == "then":
                return j
    end = i
    head = toks[i].head
    if head.i > toks[i].i:
        end = max(t.i for t in head.subtree) - toks[0].i
    # ... and no further than its first comma ("as P decreases , Q increases and R is S": R is a claim of its own)
    comma = next((j for j in range(i + 1, limit + 1) if toks[j].text == ","), None)
    end = min(end, limit, comma if comma is not None else limit)
    while end + 1 <= limit and (toks[end + 1].text == "," or toks[end + 1].lower_ == "then"):
        end += 1
    return end


def is_clause(seg: Sequence[Any]) -> bool:
    """Does the segment state a clause of its own: a subject, then a finite verb that is not a relative clause's?

    The subject may be a gerund or an infinitive ("looking at bright objects has ...", "to add something means
    ..."); a segment that opens with a finite or bare verb shares the left clause's subject ("and bakes 4").
    """
    k = 0
    while k < len(seg) and (seg[k].is_punct or seg[k].lower_ in _COORDINATORS or seg[k].lower_ in _OPENERS):
        k += 1
    if k < len(seg) and seg[k].lower_ in _SUBORDINATORS:
        k += 1
    if k < len(seg) and _defines(seg, k):
        return True  # "and let $y$ be the number of ...": a definition of its own
    if k >= len(seg):
        return False
    if seg[k].tag_ in _FINITE or seg[k].tag_ in ("VB", "VBN"):
        # A verb first shares the left clause's subject ("and bakes 4") - unless the small tagger misread a subject
        # noun as a verb: then a noun and a finite verb heading a clause follow ("and matter in the solid phase has
        # definite shape", "and learned behaviors are learned ..."). A relative clause or a second verb first
        # ("and bakes 4 that are ...", "and goes to buy") keeps the shared-subject reading.
        return _misread_subject(seg, k)
    for j in range(k + 1, len(seg)):
        t = seg[j]
        if t.tag_ in _FINITE:
            return True
        if t.tag_ in ("WDT", "WP", "WP$") or (t.lower_ == "that" and t.dep_ in ("nsubj", "nsubjpass", "mark")):
            return False  # "animals that eat plants": a relative clause, not a clause of its own
    return False


def _defines(seg: Sequence[Any], k: int) -> bool:
    """ "Let X be Y" (a definition, a claim of its own), not "Let's ..." / "Let us ..." (an instruction)."""
    if seg[k].lower_ != "let" or k + 1 >= len(seg) or seg[k + 1].lower_ in ("'s", "’s", "us"):
        return False
    return any(t.lower_ == "be" for t in seg[k + 2 : k + 8])


def _misread_subject(seg: Sequence[Any], k: int) -> bool:
    nxt = seg[k + 1] if k + 1 < len(seg) else None
    if nxt is None or nxt.tag_ in ("DT", "CD", "PRP", "PRP$", "TO", "RP") or nxt.tag_.startswith("VB"):
        return False  # "bakes 4 ...", "trades the ...", "goes to ...": a verb with its object
    for t in seg[k + 1 :]:
        if t.tag_ in ("WDT", "WP", "WP$") or t.lower_ == "that":
            return False
        if t.tag_ in _FINITE and t.dep_ not in ("relcl", "acl") and t.i - seg[k].i >= 2:
            return any(x.pos_ in ("NOUN", "PROPN") for x in seg[k + 1 : t.i - seg[0].i])
    return False


def _misread_verb(seg: Sequence[Any]) -> bool:
    """A clause whose verb the small tagger read as a plural noun: "-s" word between its subject (a noun or a
    gerund) and its object ("overgrazing increases soil erosion", "a water reservoir stores water"). Asked only
    before "and" + a clause of its own, where a noun phrase alone ("water molecules and ions are ...") has no
    object after its last noun."""
    for j in range(1, len(seg) - 1):
        t, before, after = seg[j], seg[j - 1], seg[j + 1]
        if (
            t.tag_ in ("NNS", "NNPS")
            and t.lower_.endswith("s")
            and (before.pos_ in ("NOUN", "PROPN") or before.tag_ == "VBG")
            and after.pos_ in ("NOUN", "DET", "ADJ", "NUM", "PROPN")
        ):
            return True
    return False


def starts_equation(seg: Sequence[Any]) -> bool:
    """Does the segment open with an equation ("16 - 7 = 9 duck eggs are for sale"): a claim without a verb."""
    k = 0
    while k < len(seg) and (seg[k].is_punct or seg[k].lower_ in _COORDINATORS):
        k += 1
    for t in seg[k : k + 16]:
        if _is_equation_token(t):
            return True
        if not (t.like_num or t.is_punct or t.tag_ in ("SYM", "$", "CD", "NFP", "HYPH") or len(t.text) <= 2):
            return False
    return False


def _has_main_verb(seg: Sequence[Any]) -> bool:
    # An equation is the claim only where it opens the segment ("16 - 7 = 9 duck eggs"); one inside a phrase
    # ("Substituting $c = -3$ into ..., we get", "for the 0th row ($n=0$), the sum is") is not a verb of its own.
    # "Let x be the number of adult tickets sold, and let y be ...": a definition is a claim without a finite verb.
    if any(t.tag_ in _FINITE and t.dep_ not in ("relcl", "acl") for t in seg) or starts_equation(seg):
        return True
    return bool(seg) and _defines(seg, 0)


def _subject_runs_on(toks: Sequence[Any], end: int, cuts: Sequence[tuple[int, int]], left_from: int, start: int) -> bool:
    """After "and", a subject that itself holds a coordinator: "... and soil and sediment deposited by a river are
    rich". The clause runs across further coordinators (to the next connective or comma), unless the parser joined
    the first noun after "and" to the left side ("between the sun and the earth and the new moon is ..."): then the
    later "and" is where the clause starts."""
    n = len(toks)
    stop = min([a for a, _ in cuts if a >= end] + [j for j in range(end, n) if toks[j].text in (",", ";", ":")], default=n)
    right = toks[end:stop]
    if not is_clause(right):
        return False
    first = next((t for t in right if t.pos_ in ("NOUN", "PROPN", "PRON", "NUM")), None)
    base = toks[0].i
    return first is None or not (first.dep_ == "conj" and left_from <= first.head.i - base < start)


def _imperative(seg: Sequence[Any]) -> bool:
    """ "First find the number of pillow cases in each room:", "Third, determine the cost of the flowers.",
    "Let's break it down": an instruction, not a claim. "Let X be Y" defines X; a verb-tagged first word that is
    followed by the clause's own finite verb is a misread subject ("matter in the solid phase has ...")."""
    k = 0
    while k < len(seg) and (seg[k].is_punct or seg[k].is_space or seg[k].lower_ in _OPENERS or seg[k].tag_ == "LS"):
        k += 1
    if k >= len(seg) or seg[k].tag_ != "VB" or _defines(seg, k):
        return False
    return not any(t.tag_ in _FINITE and t.dep_ in ("ROOT", "conj") for t in seg[k + 1 :])


def _header(seg: Sequence[Any]) -> bool:
    """What stands before a colon without a finite verb or an equation of its own: "Step 1", "Solving for \\(x\\)",
    "Dividing both sides by 2", "After third sale" - a heading for what follows, not a claim."""
    return bool(seg) and not any(t.tag_ in _FINITE or _is_equation_token(t) for t in seg)


def _is_edge_word(tok: Any, leading: bool) -> bool:
    word = tok.lower_
    if tok.is_punct or tok.is_space or word in _COORDINATORS or word in ("so", "because", "since"):
        return True
    return leading and (word in _BOUNDARY_CONNECTIVES or word == "then")


def _closes(seg: Sequence[Any], s: int, j: int) -> bool:
    """Token j is a closing bracket whose opening one is in the unit: kept ("4 flashlights (one per person)")."""
    pair = {")": "(", "]": "["}.get(seg[j].text)
    return pair is not None and sum(t.text == pair for t in seg[s:j]) > sum(t.text == seg[j].text for t in seg[s:j])


def instruction(seg: Sequence[Any]) -> bool:
    """A unit that states no claim: an imperative ("Third, determine the cost of the flowers"), "Let's ..."."""
    return _imperative(seg)


def clause_spans(sent: Any) -> list[tuple[int, int]]:
    """Char ranges [start, end) of one sentence's units, relative to `sent.start_char`."""
    toks = list(sent)
    n = len(toks)
    cuts: list[tuple[int, int]] = []  # token ranges [a, b) that belong to no unit
    at: list[int] = []
    i = 0
    while i < n:
        found = connective(toks, i)
        if found is None:
            i += 1
            continue
        cuts.append((i, i + found[0]))
        at.append(i)
        i += found[0]
    protected = [False] * n
    for i, tok in enumerate(toks):
        if tok.lower_ not in _SUBORDINATORS or i in at or (tok.lower_ == "as" and tok.dep_ != "mark"):
            continue
        # Only a subordinate clause that opens its claim is kept with it: in "the new moon is when P and Q is R"
        # the clause after "when" ends its claim and "and" may begin the next one.
        if (tok.dep_ in ("mark", "advmod") or i == 0) and _at_clause_start(toks, i):
            for j in range(i, _zone_end(toks, i, at) + 1):
                protected[j] = True
    in_cut = [False] * n
    for a, b in cuts:
        for j in range(a, b):
            in_cut[j] = True
    # Cut candidates: coordinators, commas, semicolons, colons outside subordinate clauses; ", and" is one.
    groups: list[list[int]] = []
    for i, t in enumerate(toks):
        if protected[i] or in_cut[i]:
            continue
        if t.text in (",", ";", ":") or (t.lower_ in _COORDINATORS and t.pos_ == "CCONJ"):
            if groups and groups[-1][-1] == i - 1:
                groups[-1].append(i)
            else:
                groups.append([i])
    stops = sorted({a for a, _ in cuts} | {g[0] for g in groups})
    accepted: list[tuple[int, int]] = []
    for g in groups:
        start, end = g[0], g[-1] + 1
        left_from = max([0, *(b for a, b in cuts if b <= start), *(b for a, b in accepted)])
        right = toks[end : min([s for s in stops if s >= end], default=n)]
        if not right or all(t.is_punct for t in right):
            continue
        words = {toks[k].text for k in g}
        if ":" in words:
            left = toks[left_from:start]
            if _imperative(left) or _header(left):
                accepted.append((left_from, end))  # the instruction or heading and the colon belong to no unit
            elif is_clause(right) and not starts_equation(right):
                accepted.append((start, end))  # "we add up the costs: The total cost ... is $18": two claims
            continue
        # The left side's own verb must be outside subordinate clauses: "If P, then in total, Q" is one claim.
        left = [toks[k] for k in range(left_from, start) if not protected[k]]
        if ";" in words:
            accepted.append((start, end))
        elif _has_main_verb(left):
            if is_clause(right) or starts_equation(right):
                accepted.append((start, end))
            elif toks[g[-1]].lower_ in _COORDINATORS and _subject_runs_on(toks, end, cuts, left_from, start):
                accepted.append((start, end))
        elif words == {"and"} and _misread_verb(left) and is_clause(right):
            accepted.append((start, end))  # "burning coal emits(NNS) sulfur dioxide and burning oil emits ..."
    # "since P C" without a comma: the premise ends where the subtree of its verb ends.
    for i in at:
        tok = toks[i]
        if tok.lower_ in ("since", "because") and tok.head.i > tok.i and (i == 0 or toks[i - 1].is_punct or toks[i - 1].lower_ in _COORDINATORS):
            stop = max(t.i for t in tok.head.subtree) - toks[0].i + 1
            if stop < n and not in_cut[stop] and is_clause(toks[stop:]):
                accepted.append((stop, stop))
            elif not any(a > i for a, _ in [*cuts, *accepted]):
                # The parse ran the premise into the main clause ("since I was paying a tip on the bill I paid
                # $36"): the main clause starts at a pronoun or name right after a noun, once the premise has its verb.
                verb = next((j for j in range(i + 1, n) if toks[j].tag_ in _FINITE), n)
                for k in range(verb + 2, n):
                    if toks[k].tag_ in ("PRP", "NNP") and toks[k - 1].pos_ in ("NOUN", "PROPN", "NUM") and is_clause(toks[k:]):
                        accepted.append((k, k))
                        break
    spans: list[tuple[int, int]] = []
    pos = 0
    base = sent.start_char
    for a, b in sorted([*cuts, *accepted, (n, n)]):
        if a > pos:
            seg = toks[pos:a]
            s, e = 0, len(seg)
            while s < e and _is_edge_word(seg[s], leading=True) and not (seg[s].lower_ == "then" and s + 1 == e):
                s += 1
            while e > s and _is_edge_word(seg[e - 1], leading=False) and not _closes(seg, s, e - 1):
                e -= 1
            if s < e:
                spans.append((seg[s].idx - base, seg[e - 1].idx + len(seg[e - 1].text) - base))
        pos = max(pos, b)
    return spans


def clause_units(doc_or_span: Any) -> list[Rcu]:
    """Units of a step (a doc or a span), sentence by sentence; offsets relative to the step's start.

    A sentence that yields no unit (only a connective, only punctuation) gives its own text without the final
    period, so a step with text always has a conclusion.
    """
    base = doc_or_span.start_char if hasattr(doc_or_span, "start_char") else 0
    sents = list(doc_or_span.sents) if hasattr(doc_or_span, "sents") else [doc_or_span]
    out: list[Rcu] = []
    dropped: list[Rcu] = []
    for sent in sents:
        text = sent.text
        if not text.strip():
            continue
        shift = sent.start_char - base
        spans = clause_spans(sent)
        if not spans:
            whole = text.strip().rstrip(".").strip()
            if whole.rstrip("-*• \n").endswith(":") and _header([t for t in sent if not t.is_punct]):
                continue  # a heading line: "Third, for the long-answer questions:"
            if whole:
                spans = [(text.index(whole), text.index(whole) + len(whole))]
        for s, e in spans:
            unit = Rcu(text[s:e], shift + s)
            toks = [t for t in sent if s <= t.idx - sent.start_char < e]
            (dropped if instruction(toks) or all(t.is_punct or t.is_space for t in toks) else out).append(unit)
    # Instructions (and a lone list bullet) state no claim; a step that is nothing else keeps them, so it still has
    # a conclusion.
    return out or dropped
