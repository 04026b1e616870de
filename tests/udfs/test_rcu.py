"""udfs.rcu: frames, the official selection rules, both role rules, sentence helpers and the a_hat rule.

Expected RCUs were worked out by hand: the rules of RECEVAL.md applied to spaCy's dependency parse of each
sentence (the parse is the input; the comment above each case gives the arcs that decide it).
Sentences: EntailmentBank task_1 test steps rendered by jobs.metaeval.entailment_bank, and GSM-8K solution sentences
from roscoe/generated/gsm8k.json with the "<<...>>" calculator annotations removed.
"""

from __future__ import annotations

import pytest

from jobs.infra.config import Settings
from udfs import rcu

PIPELINE = Settings().models.spacy

# (sentence, RCUs, conclusion under `position`, conclusion under `conjunction`)
CASES = [
    # EB. is(3) ccomp of is(25); is(15) conj of is(3) -> three frames; "so" cuts the root frame's left side.
    (
        "the northern hemisphere is a kind of hemisphere of earth and a hemisphere of earth is a kind of place, "
        "so the northern hemisphere is a kind of place.",
        [
            "the northern hemisphere is a kind of hemisphere of earth",
            "a hemisphere of earth is a kind of place",
            "the northern hemisphere is a kind of place",
        ],
        2,
        2,
    ),
    # EB. is(3) advcl ("if" mark dropped), have(10) ccomp of have(19); "so" sits inside have(19)'s subject.
    (
        "if a place is in summer, then it will have the most sunlight, so northern hemisphere will have the most "
        "sunlight in summer.",
        [
            "a place is in summer",
            "then it will have the most sunlight",
            "northern hemisphere will have the most sunlight in summer",
        ],
        2,
        2,
    ),
    # EB. take(29) conj of takes(11); "so" is cc of takes(11) and drops out.
    (
        "a complete revolution / orbit of a planet around its star takes 1 / one planetary year, so a complete "
        "revolution of the earth around the sun will take one earth year.",
        [
            "a complete revolution / orbit of a planet around its star takes 1 / one planetary year",
            "a complete revolution of the earth around the sun will take one earth year",
        ],
        1,
        1,
    ),
    # EB. made(12) conj of is(3), is(3) ccomp of made(21): "and" (cc of kind) trimmed from is(3)'s right edge.
    (
        "the milky way is a kind of galaxy and a galaxy is made of stars, so the milky way is made of stars.",
        ["the milky way is a kind of galaxy", "a galaxy is made of stars", "the milky way is made of stars"],
        2,
        2,
    ),
    # EB "so <child>." step. measure(7) is xcomp inside used(5)'s frame: a substring, dropped (rule 3).
    (
        "so light year can be used to measure the distance between the stars in milky way.",
        ["light year can be used to measure the distance between the stars in milky way"],
        0,
        0,
    ),
    # EB. "so" is mark of classified(13): excluded; is(2) ccomp.
    (
        "a galaxy is a kind of celestial object, so galaxies can be classified by shape.",
        ["a galaxy is a kind of celestial object", "galaxies can be classified by shape"],
        1,
        1,
    ),
    # EB. revolving(0) csubj and orbiting(3) xcomp are substrings of means(2)'s frame (rule 3).
    (
        "revolving around means orbiting, so the moon revolves around a planet.",
        ["revolving around means orbiting", "the moon revolves around a planet"],
        1,
        1,
    ),
    # EB. The parser hangs "and the surface of the earth" on "mountains"; contains(13) ("contains mountains")
    # is a substring of the root frame; left-over "contains mountains, so" has 3 words (< 4, rule 5).
    (
        "the surface of the moon contains mountains and the surface of the earth contains mountains, so both the "
        "surface of the moon and the surface of the earth contain mountains.",
        [
            "the surface of the moon contains mountains and the surface of the earth",
            "both the surface of the moon and the surface of the earth contain mountains",
        ],
        1,
        1,
    ),
    # GSM-8K. One predicate; its frame is the whole sentence and it has no verb-bearing modifier (rule 2).
    ("Janet sells 16 - 3 - 4 = 9 duck eggs a day.", ["Janet sells 16 - 3 - 4 = 9 duck eggs a day"], 0, 0),
    # GSM-8K. "So" (advmod, left of is(6)) cuts the frame.
    (
        "So the total amount of fabric is 2+1=3 bolts of fabric",
        ["the total amount of fabric is 2+1=3 bolts of fabric"],
        0,
        0,
    ),
    # GSM-8K. Whole-sentence frame; its "by ..." modifier has 2 words and no verb, so it stays (rule 2).
    (
        "He increased the value of the house by 80,000*1.5=120,000",
        ["He increased the value of the house by 80,000*1.5=120,000"],
        0,
        0,
    ),
    ("So he runs 9*60=540 meters", ["he runs 9*60=540 meters"], 0, 0),
    # GSM-8K. eats(3) advcl of need(17) ("If" mark dropped); no connective: both rules take the last RCU.
    (
        "If each chicken eats 3 cups of feed per day, then for 20 chickens they would need 3*20=60 cups of feed "
        "per day.",
        ["each chicken eats 3 cups of feed per day", "then for 20 chickens they would need 3*20=60 cups of feed per day"],
        1,
        1,
    ),
    # GSM-8K. means(8) keeps only its subject once advcl is(4) and ccomp going(11) are out: "that means".
    (
        "If every second glass is cheaper, that means Kylar is going to buy 16 / 2 = 8 cheaper glasses.",
        ["every second glass is cheaper", "that means", "Kylar is going to buy 16 / 2 = 8 cheaper glasses"],
        2,
        2,
    ),
    # GSM-8K. wants(17) is a relcl: out of needs(4)'s frame, its own RCU; "So" (cc) dropped.
    (
        "So in total Kylar needs to pay 24 + 40 = $64 for the glasses he wants to buy.",
        ["in total Kylar needs to pay 24 + 40 = $64 for the glasses", "he wants to buy"],
        1,
        1,
    ),
    # GSM-8K. performed(14) advcl with "because": the conjunction rule makes the main clause the conclusion.
    (
        "He also got a 300 * 4 = $1200 bonus because the company performed well in all the weeks of April.",
        ["He also got a 300 * 4 = $1200 bonus", "the company performed well in all the weeks of April"],
        1,
        0,
    ),
    # GSM-8K. "since" introduces only the RCU right after it; the last clause is not a premise.
    (
        "Shawnda charged 25 cents per tire, and since there are 2 tires on a bike, she charged 25*2 = 50 cents "
        "per bike.",
        ["Shawnda charged 25 cents per tire", "there are 2 tires on a bike", "she charged 25*2 = 50 cents per bike"],
        2,
        2,
    ),
    # The example of RECEVAL.md: sold(1) is a ccomp of sold(9), "so" cuts.
    (
        "Natalia sold 24 clips in May, so she sold 72 clips altogether.",
        ["Natalia sold 24 clips in May", "she sold 72 clips altogether"],
        1,
        1,
    ),
]


@pytest.fixture(scope="module")
def nlp():
    return rcu.load_spacy(PIPELINE)


def units(nlp, text: str) -> list[rcu.Rcu]:
    return rcu.rcus_of(nlp(text), rcu.spacy_frames)


@pytest.mark.parametrize("sentence,expected,_p,_c", CASES, ids=[c[0][:40] for c in CASES])
def test_rcus_of_real_sentences(nlp, sentence, expected, _p, _c):
    assert [u.text for u in units(nlp, sentence)] == expected


@pytest.mark.parametrize("sentence,expected,position,conjunction", CASES, ids=[c[0][:40] for c in CASES])
def test_assign_roles_both_rules(nlp, sentence, expected, position, conjunction):
    found = units(nlp, sentence)
    for rule, idx in (("position", position), ("conjunction", conjunction)):
        premises, conclusion = rcu.assign_roles(found, sentence, rule)
        assert conclusion == expected[idx], rule
        assert premises == [e for i, e in enumerate(expected) if i != idx], rule


def test_rcus_offsets_point_into_the_text(nlp):
    text = "Natalia sold 24 clips in May, so she sold 72 clips altogether."
    for unit in units(nlp, text):
        assert text[unit.start : unit.start + len(unit.text)] == unit.text


def test_load_spacy_is_cached(nlp):
    assert rcu.load_spacy(PIPELINE) is nlp


# ------------------------------------------------------------------------------ selection rules on given frames
def _no_verb(start: int, end: int) -> bool:
    return False


def _verb_everywhere(start: int, end: int) -> bool:
    return True


def test_select_rcus_rule2_removes_verb_modifier_of_whole_sentence_frame():
    s = "the ice cube will melt by absorbing the solar energy"
    whole = rcu.Frame(0, len(s), ((s.index("by"), len(s)),))
    inner = rcu.Frame(s.index("absorbing"), len(s))
    got = rcu.select_rcus(s, [whole, inner], _verb_everywhere)
    assert [u.text for u in got] == ["the ice cube will melt", "absorbing the solar energy"]


def test_select_rcus_rule2_keeps_modifier_without_verb():
    s = "the ice cube will melt by absorbing the solar energy"
    got = rcu.select_rcus(s, [rcu.Frame(0, len(s), ((s.index("by"), len(s)),))], _no_verb)
    assert [u.text for u in got] == [s]


def test_select_rcus_rule5_leftover_needs_four_words_and_a_verb():
    s = "she sold 72 clips and then she went home to sleep"
    frames = [rcu.Frame(0, 17)]  # "she sold 72 clips"; left-over "and then she went home to sleep"
    assert [u.text for u in rcu.select_rcus(s, frames, _verb_everywhere)] == [
        "she sold 72 clips",
        "and then she went home to sleep",
    ]
    assert [u.text for u in rcu.select_rcus(s, frames, _no_verb)] == ["she sold 72 clips"]


def test_select_rcus_rule6_no_frames_gives_the_sentence():
    assert [u.text for u in rcu.select_rcus("A: 18.", [], _no_verb)] == ["A: 18"]
    assert rcu.select_rcus("   ", [], _no_verb) == []


def test_frame_from_tags_official_span_and_modifiers():
    words = ["He", "quickly", "sold", "the", "clips", "in", "May", "."]
    offsets, at = [], 0
    for w in words:
        offsets.append((at, at + len(w)))
        at += len(w) + 1
    tags = ["B-ARG0", "B-ARGM-MNR", "B-V", "B-ARG1", "I-ARG1", "B-ARGM-TMP", "I-ARGM-TMP", "O"]
    frame = rcu.frame_from_tags(tags, offsets)
    text = " ".join(words)
    assert text[frame.start : frame.end] == "He quickly sold the clips in May"
    assert [text[s:e] for s, e in frame.modifiers] == ["quickly", "in May"]
    assert rcu.frame_from_tags(["O"] * 8, offsets) is None
    # continuation arguments are dropped before the span is taken
    cont = ["B-ARG0", "O", "B-V", "O", "O", "O", "C-ARG1", "O"]
    frame = rcu.frame_from_tags(cont, offsets)
    assert text[frame.start : frame.end] == "He quickly sold"


# ------------------------------------------------------------------------------ edge cases: defined results
EDGE = [
    ("", [], ""),
    ("Yes", [], "Yes"),
    ("3 * 4 = 12, so she has 12 apples.", [], "she has 12 apples"),  # the equation has no verb: not an RCU
    ("😀 🎉", [], "😀 🎉"),
    ('He said "hello', [], 'He said "hello'),
]


@pytest.mark.parametrize("text,premises,conclusion", EDGE)
def test_edge_cases_defined(nlp, text, premises, conclusion):
    found = units(nlp, text) if text else []
    assert rcu.assign_roles(found, text, "position") == (premises, conclusion)


def test_edge_cases_never_crash(nlp):
    for text in ["a " * 2500, "Der Hund läuft schnell, weil er Hunger hat.", "日本語の文です。", "\n\n", "(((", "so."]:
        for rule in ("position", "conjunction"):
            premises, conclusion = rcu.assign_roles(units(nlp, text), text, rule)
            assert isinstance(conclusion, str) and all(isinstance(p, str) for p in premises)


def test_assign_roles_unknown_rule_raises():
    with pytest.raises(ValueError, match="role rule"):
        rcu.assign_roles([rcu.Rcu("a", 0)], "a", "random")


# ------------------------------------------------------------------------------ text helpers and a_hat
def test_clean_text_strips_calculator_annotations():
    assert rcu.clean_text("so 3 + 4 = <<3+4=7>>7 eggs") == "so 3 + 4 = 7 eggs"
    assert rcu.clean_text("so 3 + 4 = <<3+4=7>>7 eggs", strip_calculator=False) == "so 3 + 4 = <<3+4=7>>7 eggs"


def test_lines_drop_blank_lines():
    assert rcu.lines(" a \n\n b\n") == ["a", "b"]


def test_derive_answer_rules():
    assert rcu.derive_answer("18", "x", "c") == ("18", "given")
    assert rcu.derive_answer(None, "The answer is 7. So the answer is 72.\nmore", "c") == ("72", "indicator")
    assert rcu.derive_answer("  ", "Thus [ANSWER]: (B) False", "c") == ("(B) False", "indicator")
    assert rcu.derive_answer(None, "she sold 72 clips", "she sold 72 clips") == ("she sold 72 clips", "last_conclusion")
    assert rcu.derive_answer(None, "the answer is", "c") == ("c", "last_conclusion")


# ------------------------------------------------------------------------------ SRL option
SRL_LABELS = ["O", "B-V", "B-ARG0", "I-ARG0", "B-ARG1", "I-ARG1", "B-ARGM-TMP", "I-ARGM-TMP"]


def build_tiny_srl(out) -> str:
    """A tiny random BERT token classifier with SRL BIO labels and a locally trained tokenizer."""
    import torch
    from tokenizers import processors
    from transformers import BertConfig, BertForTokenClassification

    from jobs.infra.tiny_models import _save, _train_bpe

    tok = _train_bpe(400, ["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=len(SRL_LABELS),
        id2label=dict(enumerate(SRL_LABELS)),
        label2id={label: i for i, label in enumerate(SRL_LABELS)},
        pad_token_id=tok.token_to_id("[PAD]"),
    )
    model = BertForTokenClassification(config).eval()
    _save(model, tok, out, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    return str(out)


@pytest.fixture(scope="module")
def tiny_srl(tmp_path_factory) -> str:
    return build_tiny_srl(tmp_path_factory.mktemp("srl") / "tiny-srl")


class _FakeSrl:
    """Logits as a known function of the token ids: the label of the word a token starts."""

    def __init__(self, tokenizer, word_labels: dict[str, str]) -> None:
        import torch

        self.config = type("Cfg", (), {"id2label": dict(enumerate(SRL_LABELS))})()
        self.by_id: dict[int, int] = {}
        for word, label in word_labels.items():
            pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
            self.by_id[pieces[0]] = SRL_LABELS.index(label)
            for later in pieces[1:]:  # must be ignored: a word's tag is its first piece's
                self.by_id.setdefault(later, SRL_LABELS.index("B-ARGM-TMP"))
        self._param = torch.nn.Parameter(torch.zeros(1))

    def parameters(self):
        return iter([self._param])

    def __call__(self, input_ids, **_):
        import torch

        labels = [[self.by_id.get(int(t), 0) for t in row] for row in input_ids]
        logits = torch.nn.functional.one_hot(torch.tensor(labels), len(SRL_LABELS)).float()
        return type("Out", (), {"logits": logits})()


def test_srl_frames_from_bio_tags(nlp, tiny_srl):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_srl)
    fake = _FakeSrl(
        tokenizer,
        {"Natalia": "B-ARG0", "sold": "B-V", "clips": "B-ARG1", "in": "B-ARGM-TMP", "May": "I-ARGM-TMP"},
    )
    sent = next(nlp("Natalia sold 24 clips in May.").sents)
    frames = rcu.srl_frames(sent, fake, tokenizer)
    assert len(frames) == 1  # one predicate (sold), one pass
    text = sent.text
    assert text[frames[0].start : frames[0].end] == "Natalia sold 24 clips in May"
    assert [text[s:e] for s, e in frames[0].modifiers] == ["in May"]
    # whole-sentence frame, its modifier has 2 words: kept (rule 2)
    assert [u.text for u in rcu.select_rcus(text, frames, rcu.verb_checker(sent))] == ["Natalia sold 24 clips in May"]


def test_srl_frames_real_tiny_model_defined_on_edge_cases(nlp, tiny_srl):
    from udfs import runtime

    model, tokenizer = runtime.load_model(tiny_srl, "srl")
    for text in ["Natalia sold 24 clips in May, so she sold 72 clips altogether.", "Yes", "😀 🎉", "a " * 300]:
        doc = nlp(text)
        found = rcu.rcus_of(doc, lambda s: rcu.srl_frames(s, model, tokenizer, max_length=64))
        premises, conclusion = rcu.assign_roles(found, text, "position")
        assert conclusion and all(isinstance(p, str) for p in premises)
        for unit in found:
            assert text[unit.start : unit.start + len(unit.text)] == unit.text
