"""udfs.rcu_clauses (the default extractor) with the default role rule, and the role rules of udfs.rcu on its units.

Expected units were written by hand from the guidelines in bench/data/README.md (and docs/design/RECEVAL.md
"Clause units"), not read off the extractor. The comment above each case names the rule it pins: without that rule
the case gives other units or another conclusion. Sentences: the examples of issue #15, EntailmentBank task_1
steps rendered by jobs.metaeval.entailment_bank, GSM-8K steps (roscoe generated/gsm8k.json), and a few written here.
"""

from __future__ import annotations

import sys
import time

import pytest

from jobs.infra.config import Settings
from jobs.infra.config_paths import PROJECT_ROOT
from udfs import rcu
from udfs import rcu_clauses as RC

sys.path.append(str(PROJECT_ROOT / "bench"))  # bench/rcu_agreement.py: the RCU benchmark's edge-defect rule
import rcu_agreement as A  # noqa: E402

PIPELINE = Settings().models.spacy

# (step, premises, conclusion) under the default rule (conjunction)
CASES = [
    # Issue #15: the second "is" has its own subject ("light"), which the parser hangs on "color" as a conjunct;
    # the verb frames gave ["dark is a kind of color and light", "is a kind of color, so"].
    (
        "dark is a kind of color and light is a kind of color, so light and dark are kinds of color.",
        ["dark is a kind of color", "light is a kind of color"],
        "light and dark are kinds of color",
    ),
    # Issue #15: frames gave ["an invisible gas and water vapor is found in the atmosphere"].
    (
        "water vapor is an invisible gas and water vapor is found in the atmosphere, so the atmosphere contains an "
        "invisible gas.",
        ["water vapor is an invisible gas", "water vapor is found in the atmosphere"],
        "the atmosphere contains an invisible gas",
    ),
    # EB: "if P, then Q" is one fact (frames cut it into "a place is in summer" and "then it will have ...").
    (
        "if a place is in summer, then it will have the most sunlight, so northern hemisphere will have the most "
        "sunlight in summer.",
        ["if a place is in summer, then it will have the most sunlight"],
        "northern hemisphere will have the most sunlight in summer",
    ),
    # EB: "if P then Q" without a comma, followed by a clause of its own after "and".
    (
        "if something contains something else then that something else can be found in that something and fossil "
        "fuel contains chemical energy, so chemical energy can be found in fossil fuels.",
        [
            "if something contains something else then that something else can be found in that something",
            "fossil fuel contains chemical energy",
        ],
        "chemical energy can be found in fossil fuels",
    ),
    # EB: a copular sentence with a relative clause stays one unit (frames: "that is closer to ..." apart).
    (
        "the moon is the celestial object that is closer to the earth than the sun, so the moon appears larger.",
        ["the moon is the celestial object that is closer to the earth than the sun"],
        "the moon appears larger",
    ),
    # EB: a clause-opening "as" (proportion) keeps its clause; "and" then opens a clause of its own.
    (
        "as the smoothness of something increases , the friction of that something will decrease and grease is used "
        "to make an object 's surface more smooth, so grease is used to decrease the friction among objects.",
        [
            "as the smoothness of something increases , the friction of that something will decrease",
            "grease is used to make an object 's surface more smooth",
        ],
        "grease is used to decrease the friction among objects",
    ),
    # EB: a gerund subject opens a clause of its own.
    (
        "the moon is less bright than the sun and looking at bright objects has a negative impact on the eyes, so "
        "looking at the moon has less of a negative impact on the eyes.",
        ["the moon is less bright than the sun", "looking at bright objects has a negative impact on the eyes"],
        "looking at the moon has less of a negative impact on the eyes",
    ),
    # EB: "X is when P" ends its claim; the "and" after it opens the next one.
    (
        "the new moon is when the moon is in between the sun and the earth and the new moon is when the dark half "
        "of the moon faces the earth, so the new moon is when the moon could block the earth from the sun.",
        [
            "the new moon is when the moon is in between the sun and the earth",
            "the new moon is when the dark half of the moon faces the earth",
        ],
        "the new moon is when the moon could block the earth from the sun",
    ),
    # "so" with no comma (GSM-8K); two clauses with their own subjects before it.
    (
        "1 pound of butter makes 1 dozen croissants and he needs to make 6 dozen so he needs 1*6 = 6 pounds of butter",
        ["1 pound of butter makes 1 dozen croissants", "he needs to make 6 dozen"],
        "he needs 1*6 = 6 pounds of butter",
    ),
    # Verbs sharing one subject are one unit ("and bakes ..." has no subject of its own).
    (
        "Janet eats 3 duck eggs for breakfast and bakes 4 into muffins so 3 + 4 = 7 duck eggs are used",
        ["Janet eats 3 duck eggs for breakfast and bakes 4 into muffins"],
        "3 + 4 = 7 duck eggs are used",
    ),
    # After "and", a clause whose subject holds "and" itself: it runs across that coordinator to its verb.
    (
        "the sun is a star and the moon and the earth are in the solar system, so the sun is in the solar system.",
        ["the sun is a star", "the moon and the earth are in the solar system"],
        "the sun is in the solar system",
    ),
    (
        "Tom has 3 apples and his brother and sister have 4 apples, so they have 7 apples.",
        ["Tom has 3 apples", "his brother and sister have 4 apples"],
        "they have 7 apples",
    ),
    # GSM-8K: verbs sharing "Debra" stay one unit ("then sees ..." has no subject); the comma before an equation
    # cuts; "15 bees that are still away" is a relative clause after "and", not a clause of its own.
    (
        "Debra first sees 30 bees leave the hive, then sees 1/2 that many return, 30 x 1/2 = 15 bees that return and "
        "15 bees that are still away from the hive.",
        ["Debra first sees 30 bees leave the hive, then sees 1/2 that many return"],
        "30 x 1/2 = 15 bees that return and 15 bees that are still away from the hive",
    ),
    # Verbs sharing one subject stay one unit even when a later verb follows ("he picked" is not the subject of
    # "gives away": the right side opens with its verb).
    (
        "Mark eats 2 apples and gives away the 3 apples he picked, so he has 0 apples left.",
        ["Mark eats 2 apples and gives away the 3 apples he picked"],
        "he has 0 apples left",
    ),
    # A coordinated subject is not a clause: "the sun" has no verb of its own.
    ("the sun and the moon are in the sky, so the sky has two lights.", ["the sun and the moon are in the sky"], "the sky has two lights"),
    # List commas are not cut.
    (
        "He spend $12 on passion fruit, $12.0 on jackfruit, and $20 on honey so he spends 12+12+20 = $44 in total",
        ["He spend $12 on passion fruit, $12.0 on jackfruit, and $20 on honey"],
        "he spends 12+12+20 = $44 in total",
    ),
    # A comma splice: the clause after the comma has its own subject; the next one opens with an equation.
    (
        "Each day Janet's ducks lay 16 eggs and she uses 7, 16 - 7 = 9 duck eggs are for sale",
        ["Each day Janet's ducks lay 16 eggs", "she uses 7"],
        "16 - 7 = 9 duck eggs are for sale",
    ),
    # A verbless equation is a unit (the frames found none: the step had no premise).
    ("3 * 4 = 12, so she has 12 apples.", ["3 * 4 = 12"], "she has 12 apples"),
    ("6x=180", [], "6x=180"),
    # "because": "C because P" concludes C (the official last-unit rule would take P).
    ("They make $5 off each gallon because 10 - 5 = 5", ["10 - 5 = 5"], "They make $5 off each gallon"),
    # "because" before two coordinated clauses: both are premises (a premise carries across "and").
    (
        "He stayed home because it rained and the road was closed.",
        ["it rained", "the road was closed"],
        "He stayed home",
    ),
    # "because of" is a preposition, not a connective.
    ("He stayed home because of the rain, so he missed the game.", ["He stayed home because of the rain"], "he missed the game"),
    # "Since P, C" concludes C; the comma ends the premise.
    (
        "Since each box of oranges contains 20 oranges, Mrs. Harrington sold 6 x 20 = 120 oranges.",
        ["each box of oranges contains 20 oranges"],
        "Mrs. Harrington sold 6 x 20 = 120 oranges",
    ),
    # "since P C" without a comma, the parser running P into C: C starts at the name after P's noun.
    (
        "Since there are 4 harvests per year John can harvest 4*1000 = 4000 pineapples within a year.",
        ["there are 4 harvests per year"],
        "John can harvest 4*1000 = 4000 pineapples within a year",
    ),
    (
        "I was going to pay $30 but since I was paying an additional 20% tip on the bill I paid 30*1.20 = $36.00",
        ["I was going to pay $30", "I was paying an additional 20% tip on the bill"],
        "I paid 30*1.20 = $36.00",
    ),
    # ", so" is a connective even where the parser reads a degree "so" ("so warm"): EB renders every step so.
    (
        "temperature is a measure of heat, so warm / becoming warm means temperature increases.",
        ["temperature is a measure of heat"],
        "warm / becoming warm means temperature increases",
    ),
    # "Since P C" without a comma, parsed right: the premise ends with its verb's subtree.
    ("Since the price rose the shop sold fewer apples.", ["the price rose"], "the shop sold fewer apples"),
    # "since" + a date is a preposition.
    ("He has lived here since 2010, so he knows the town.", ["He has lived here since 2010"], "he knows the town"),
    # "C, since P" concludes C.
    (
        "Artie will round his petunias up from $1.87 to $2, since the number following the 1 is 5 or higher.",
        ["the number following the 1 is 5 or higher"],
        "Artie will round his petunias up from $1.87 to $2",
    ),
    # "thus" / "therefore" / "hence" open a conclusion where a clause begins ...
    ("Thus, they have a total of $45 + $40 = $85 left.", [], "they have a total of $45 + $40 = $85 left"),
    ("Hence the total is 5 + 3 = 8 apples.", [], "the total is 5 + 3 = 8 apples"),
    (
        "The price is $5 and therefore 3 books cost $15.",
        ["The price is $5"],
        "3 books cost $15",
    ),
    # ... and stay inside a clause they sit in.
    ("She therefore still needs to play 30 – 7 – 14 = 9 hours.", [], "She therefore still needs to play 30 – 7 – 14 = 9 hours"),
    # "as a result"
    (
        "The bakery sold 12 cakes, and as a result, it earned $36.",
        ["The bakery sold 12 cakes"],
        "it earned $36",
    ),
    # "which means (that)"
    (
        "Each of the people that were emailed are bringing 2 friends, which means that they will be in groups of "
        "1 +2 = 3 people.",
        ["Each of the people that were emailed are bringing 2 friends"],
        "they will be in groups of 1 +2 = 3 people",
    ),
    # "so that's" concludes; "so that he could" (purpose) and "so many" (degree) do not.
    ("There are 4 rooms so that's 240*4 = 960 square feet", ["There are 4 rooms"], "that's 240*4 = 960 square feet"),
    ("He saved money so that he could buy a bike.", [], "He saved money so that he could buy a bike"),
    ("He has so many apples that he gives 3 away.", [], "He has so many apples that he gives 3 away"),
    # "so A and B": the conclusion is the whole coordination.
    ("She has 3 apples, so she eats 1 and he eats 2.", ["She has 3 apples"], "she eats 1 and he eats 2"),
    # A conditional with coordinated clauses in its antecedent stays whole up to "then".
    (
        "If Kyle took 5 fries, and Billy took 10, and Colby took 2, then in total, Griffin had 5+10+2=17 fries",
        [],
        "If Kyle took 5 fries, and Billy took 10, and Colby took 2, then in total, Griffin had 5+10+2=17 fries",
    ),
    # "When P, Q" is one claim.
    ("When Jennie began, there were 30 + 20 = 50 letters.", [], "When Jennie began, there were 30 + 20 = 50 letters"),
    # An instruction before a colon states no claim.
    (
        "First find the number of pillow cases in each room: 2 sheets * 2 pillow cases/sheet = 4 pillow cases",
        [],
        "2 sheets * 2 pillow cases/sheet = 4 pillow cases",
    ),
    # A relative clause after "and" is not a clause of its own.
    ("an animal that eats plants and animals is an omnivore.", [], "an animal that eats plants and animals is an omnivore"),
    # Two sentences in one step: "That means" concludes across the sentence boundary.
    (
        "Prince sells 15kg of meat every hour he works, and he works 10 hours a day. That means he sells 15 * 10 = "
        "150kg of meat a day.",
        ["Prince sells 15kg of meat every hour he works", "he works 10 hours a day"],
        "he sells 15 * 10 = 150kg of meat a day",
    ),
    # A degree "so" ("so tired") is no connective; the one after the comma is.
    ("He was so tired, so he slept.", ["He was so tired"], "he slept"),
    # Issue 31: the small tagger reads the second subject "matter" as a verb (VB); a noun and the clause's own finite
    # verb follow, so it is a subject, and the clause after "and" is a unit of its own.
    (
        "chocolate is a kind of solid substance and matter in the solid phase has definite shape, so chocolate has a "
        "definite shape.",
        ["chocolate is a kind of solid substance", "matter in the solid phase has definite shape"],
        "chocolate has a definite shape",
    ),
    # Issue 31: "learned behaviors" is read as a verb (VBD) and its object; "are" is the clause's verb.
    (
        "a dolphin balancing a ball on its nose is a learned behavior and learned behaviors are learned over the "
        "lifetime of the animal, so balancing a ball is learned over the lifetime of a dolphin.",
        ["a dolphin balancing a ball on its nose is a learned behavior",
         "learned behaviors are learned over the lifetime of the animal"],
        "balancing a ball is learned over the lifetime of a dolphin",
    ),
    # EB test: the left clause's verb "increases" is tagged a plural noun; it stands between subject and object.
    (
        "overgrazing increases soil erosion and topsoil is a kind of soil, so overgrazing can increase topsoil erosion.",
        ["overgrazing increases soil erosion", "topsoil is a kind of soil"],
        "overgrazing can increase topsoil erosion",
    ),
    # Noun coordination in a subject is not cut (ProcessBench math-130/0).
    (
        "Betty and Wilma can't break the students up into groups of equal size because there are more than two students.",
        ["there are more than two students"],
        "Betty and Wilma can't break the students up into groups of equal size",
    ),
    # Verbs sharing one subject stay one unit (ProcessBench gsm8k-207/1).
    (
        "Jenna starts with 8 sapphires and trades 3 sapphires for 2 rubies.",
        [],
        "Jenna starts with 8 sapphires and trades 3 sapphires for 2 rubies",
    ),
    # An instruction states no claim: in no unit (ProcessBench gsm8k-13/2).
    ("Third, determine the cost of the flowers. Each flower costs $6.", [], "Each flower costs $6"),
    # "Let's ..." is an instruction; "Let X be Y" defines X (ProcessBench gsm8k-339/0).
    ("Let's define the current ages. Let S be Sam's current age.", [], "Let S be Sam's current age"),
    # "and let y be ...": a definition of its own after the comma (ProcessBench math-445/0).
    (
        "Let x be the number of adult tickets sold, and let y be the number of children's tickets sold.",
        ["Let x be the number of adult tickets sold"],
        "let y be the number of children's tickets sold",
    ),
    # A heading before a colon, without a finite verb, is in no unit (ProcessBench gsm8k-58/4).
    ("Dividing both sides by 2: x = 1", [], "x = 1"),
    # A colon followed by a clause of its own ends the unit before it (ProcessBench gsm8k-12/4).
    (
        "Next, we add up all the individual costs: The total cost for bowls is $5.00.",
        ["Next, we add up all the individual costs"],
        "The total cost for bowls is $5.00",
    ),
    # A closing bracket whose opening one is in the unit stays (ProcessBench gsm8k-91/0).
    (
        "There are 4 people living in the house, so they need 4 flashlights (one per person).",
        ["There are 4 people living in the house"],
        "they need 4 flashlights (one per person)",
    ),
    # An equation inside a phrase is not the left side's verb: no cut at the comma (ProcessBench math-166/5).
    ("Substituting c = -3 into b + c = -3, we get b = 0.", [], "Substituting c = -3 into b + c = -3, we get b = 0"),
]


@pytest.fixture(scope="module")
def nlp():
    return rcu.load_spacy(PIPELINE)


def roles(nlp, text: str, rule: str = "conjunction") -> tuple[list[str], str]:
    return rcu.assign_roles(RC.clause_units(nlp(text)), text, rule)


def test_default_settings_use_clauses_and_conjunction():
    assert (Settings().steps.extractor, Settings().steps.roles) == ("clauses", "conjunction")


@pytest.mark.parametrize("text,premises,conclusion", CASES, ids=[c[0][:40] for c in CASES])
def test_clause_units_and_default_roles(nlp, text, premises, conclusion):
    assert roles(nlp, text) == (premises, conclusion)


@pytest.mark.parametrize("text", [c[0] for c in CASES], ids=[c[0][:40] for c in CASES])
def test_units_point_into_the_text_and_carry_no_connective_at_their_edges(nlp, text):
    units = RC.clause_units(nlp(text))
    assert units
    for unit in units:
        assert text[unit.start : unit.start + len(unit.text)] == unit.text
        assert not A.edge_defect(unit.text), unit.text


def test_position_rule_stays_available_and_reads_the_last_unit(nlp):
    # the official rule: the last unit, whatever the connectives say
    assert roles(nlp, "They make $5 off each gallon because 10 - 5 = 5", "position") == (
        ["They make $5 off each gallon"],
        "10 - 5 = 5",
    )
    assert roles(nlp, "3 * 4 = 12, so she has 12 apples.", "position") == (["3 * 4 = 12"], "she has 12 apples")


def test_conjunction_premise_does_not_carry_across_a_comma():
    # "since P, C": C follows P after a comma only; it is the conclusion, not a second premise
    text = "since P holds, C holds"
    units = [rcu.Rcu("P holds", 6), rcu.Rcu("C holds", 15)]
    assert rcu.assign_roles(units, text, "conjunction") == (["P holds"], "C holds")
    # "because P and Q": Q follows a coordinator, so it is a premise too; the free unit is the conclusion
    text = "C holds because P holds and Q holds"
    units = [rcu.Rcu("C holds", 0), rcu.Rcu("P holds", 16), rcu.Rcu("Q holds", 28)]
    assert rcu.assign_roles(units, text, "conjunction") == (["P holds", "Q holds"], "C holds")


def test_conjunction_joins_only_units_separated_by_a_coordinator_or_comma():
    text = "P holds, so A holds and B holds"
    units = [rcu.Rcu("P holds", 0), rcu.Rcu("A holds", 12), rcu.Rcu("B holds", 24)]
    assert rcu.assign_roles(units, text, "conjunction") == (["P holds"], "A holds and B holds")
    # touching units (a frame cut inside its clause) are not glued back together
    text = "P holds, so that means B holds"
    units = [rcu.Rcu("P holds", 0), rcu.Rcu("that means", 12), rcu.Rcu("B holds", 23)]
    assert rcu.assign_roles(units, text, "conjunction") == (["P holds", "that means"], "B holds")


# ------------------------------------------------------------------------------ bad input: units, never a crash
@pytest.mark.parametrize(
    "text,expected",
    [
        ("Because.", ["Because"]),  # only a connective: the sentence itself, so the step keeps a conclusion
        ("😀 🎉", ["😀 🎉"]),
        ("(((", ["((("]),
        ("= = =", ["= = ="]),
        ("Der Hund läuft schnell, weil er Hunger hat.", ["Der Hund läuft schnell, weil er Hunger hat"]),
        ("日本語の文です。", ["日本語の文です"]),
        ("   ", []),
    ],
)
def test_bad_input_gives_units(nlp, text, expected):
    assert [u.text for u in RC.clause_units(nlp(text))] == expected


def test_five_thousand_word_step_is_cut_fast_and_whole(nlp):
    sentence = "He has 3 apples and she has 4 pears, so they have 7 fruits. "
    text = sentence * 400  # 5,200 words, 400 sentences in one step
    doc = nlp(text)
    start = time.perf_counter()
    units = RC.clause_units(doc)
    elapsed = time.perf_counter() - start
    assert [u.text for u in units[:3]] == ["He has 3 apples", "she has 4 pears", "they have 7 fruits"]
    assert len(units) == 1200
    assert elapsed < 5  # linear in the tokens: ~0.1 s here
    premises, conclusion = rcu.assign_roles(units, text, "conjunction")
    assert conclusion == "they have 7 fruits" and len(premises) == 1199


# ------------------------------------------------------------------------------ every rule is pinned by a case
# Each rule of udfs/rcu_clauses.py and the conjunction role rule, switched off by replacing its line in a copy of
# the module's source: at least one case above must then fail (the cases pin the rules, not just the output).
RULES = {
    "shared subject": ("c", 'if seg[k].tag_ in _FINITE or seg[k].tag_ in ("VB", "VBN"):', "if False:"),
    "misread subject": ("c", "return _misread_subject(seg, k)", "return False"),
    "misread verb before and": ("c", 'elif words == {"and"} and _misread_verb(left) and is_clause(right):', "elif False:"),
    "instruction in no unit": ("c", "(dropped if instruction(toks) or all(", "(dropped if False and all("),
    "let X be Y": ("c", 'return True  # "and let $y$ be', 'pass  # "and let $y$ be'),
    "colon before a clause": ("c", "elif is_clause(right) and not starts_equation(right):", "elif False:"),
    "closing bracket kept": ("c", "and not _closes(seg, s, e - 1):", ":"),
    "equation opens the segment": ("c", "for t in seg) or starts_equation(seg):", "or _is_equation_token(t) for t in seg):"),
    "a definition is a left side": ("c", "return bool(seg) and _defines(seg, 0)", "return False"),
    "relative clause": ("c", 'return False  # "animals that eat plants"', 'pass  # "animals that eat plants"'),
    "subordinate clause kept whole": ("c", "for j in range(i, _zone_end(toks, i, at) + 1):", "for j in range(i, i):"),
    "if ... then": ("c", 'if toks[j].lower_ == "then":', "if False:"),
    "conjunct of the left side": ("c", 'not (first.dep_ == "conj" and left_from', 'not (False and left_from'),
    "subject across a coordinator": ("c", "elif toks[g[-1]].lower_ in _COORDINATORS and _subject_runs_on(", "elif False and ("),
    "equation after a comma": ("c", "if is_clause(right) or starts_equation(right):", "if is_clause(right):"),
    "instruction or heading before a colon": ("c", "if _imperative(left) or _header(left):", "if False:"),
    "thus/therefore at a clause start": ("c", "if word in _BOUNDARY_CONNECTIVES and _at_clause_start(toks, i):", "if word in _BOUNDARY_CONNECTIVES:"),
    "because of": ("c", 'return None if nxt == "of" else (1, "premise")', 'return (1, "premise")'),
    "since + clause": ("c", 'return (1, "premise") if _verb_before_break(toks, i) else None', 'return (1, "premise")'),
    "so that (purpose)": ("c", 'return None  # purpose: "so that he can"', "pass"),
    "so (degree)": ("c", 'return None  # degree: "so big", "so quickly"', "pass"),
    ", so": ("c", 'return 1, "conclusion"  # ", so"', 'pass  # ", so"'),
    "which means": ("c", 'if word in ("which", "that", "this") and nxt == "means"', "if False"),
    "as a result": ("c", 'if word == "as" and nxt == "a" and after == "result":', "if False:"),
    "since P C: subtree": ("c", "if stop < n and not in_cut[stop] and is_clause(toks[stop:]):", "if False:"),
    "since P C: name after a noun": ("c", "elif not any(a > i for a, _ in [*cuts, *accepted]):", "elif False:"),
    "left side has its own verb": ("c", "        elif _has_main_verb(left):", "        elif True:"),
    "conclusion span joined": ("r", "if first < last:", "if False:"),
    "premise across and/or": ("r", 'elif roles and roles[-1] == "premise" and re.search', "elif False and re.search"),
    "C because P": ("r", "idx = free[-1] if free else idx", "idx = idx"),
    "conclusion carried on": ("r", 'elif roles and roles[-1] == "conclusion":', "elif False:"),
}


def _mutant(module, old: str, new: str):
    import sys
    import types

    source = open(module.__file__, encoding="utf-8").read()
    assert source.count(old) == 1, old
    mutant = types.ModuleType(f"{module.__name__}_mutant")
    sys.modules[mutant.__name__] = mutant  # dataclasses look their module up
    try:
        exec(compile(source.replace(old, new), mutant.__name__, "exec"), mutant.__dict__)
    finally:
        del sys.modules[mutant.__name__]
    return mutant


@pytest.fixture(scope="module")
def parsed(nlp):
    return {text: nlp(text) for text, _, _ in CASES}


@pytest.mark.parametrize("rule", list(RULES))
def test_every_rule_has_a_case_that_fails_without_it(parsed, rule):
    where, old, new = RULES[rule]
    clauses = _mutant(RC, old, new) if where == "c" else RC
    roles_of = _mutant(rcu, old, new).assign_roles if where == "r" else rcu.assign_roles
    failing = [
        text for text, premises, conclusion in CASES
        if roles_of(clauses.clause_units(parsed[text]), text, "conjunction") != (premises, conclusion)
    ]
    assert failing, f"no case fails without the rule {rule!r}"
