"""udfs.cot_fewshot and its loaders: BBH 3-shot and MGSM native/English few-shot CoT prompts, hand-written expectations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.cot import data as D
from jobs.cot.settings import CotSettings
from jobs.infra.config_paths import resolve_path
from udfs import cot_fewshot as FS

HERE = Path(__file__).resolve().parents[1] / "data"
SPORTS = HERE / "bbh_cot_prompts" / "sports_understanding.txt"  # BBH's file, unchanged (tests/data/README.md)
ROOT = resolve_path(CotSettings().data_root)

# The expected prompt, written out by hand from the file (lm-eval bbh_cot_fewshot_sports_understanding's layout).
SPORTS_PROMPT = (
    "Determine whether an artificially constructed sentence relating to sports is plausible or not.\n"
    "\n"
    'Q: Is the following sentence plausible? "Bam Adebayo scored a reverse layup in the Western Conference Finals."\n'
    "A: Let's think step by step. Bam Adebayo is an American basketball player. Scoring a reverse layup in the "
    "Western Conference Finals is part of the NBA Finals. So the answer is yes.\n"
    "\n"
    'Q: Is the following sentence plausible? "Santi Cazorla scored a touchdown."\n'
    "A: Let's think step by step. Santi Cazorla is a soccer player. Touchdown is part of American football and "
    "rugby. So the answer is no.\n"
    "\n"
    'Q: Is the following sentence plausible? "DeMar DeRozan was called for the goal tend."\n'
    "A: Let's think step by step. DeMar DeRozan is an American basketball player. Goal tending is part of "
    "basketball. So the answer is yes.\n"
    "\n"
    'Q: Is the following sentence plausible? "Joao Moutinho caught the screen pass in the NFC championship."\n'
    "A: Let's think step by step.\n"
)
QUESTION = 'Is the following sentence plausible? "Joao Moutinho caught the screen pass in the NFC championship."'


def test_bbh_fewshot_three_shots_is_the_lm_eval_prompt():
    prefix, suffix = FS.bbh_fewshot(SPORTS.read_text(encoding="utf-8"), 3)
    assert FS.fewshot_prompt(prefix, QUESTION, suffix) == SPORTS_PROMPT
    assert "canary" not in prefix and "-----" not in prefix


def test_bbh_fewshot_fewer_shots_keeps_the_first_and_the_description():
    prefix, suffix = FS.bbh_fewshot(SPORTS.read_text(encoding="utf-8"), 1)
    prompt = FS.fewshot_prompt(prefix, "Is X plausible?", suffix)
    assert prompt == (
        "Determine whether an artificially constructed sentence relating to sports is plausible or not.\n\n"
        'Q: Is the following sentence plausible? "Bam Adebayo scored a reverse layup in the Western Conference '
        'Finals."\nA: Let\'s think step by step. Bam Adebayo is an American basketball player. Scoring a reverse '
        "layup in the Western Conference Finals is part of the NBA Finals. So the answer is yes.\n\n"
        "Q: Is X plausible?\nA: Let's think step by step.\n"
    )


def test_bbh_fewshot_refuses_more_shots_than_the_file_and_a_foreign_layout():
    with pytest.raises(FS.FewshotError, match="holds 3 exemplars"):
        FS.bbh_fewshot(SPORTS.read_text(encoding="utf-8"), 4)
    with pytest.raises(FS.FewshotError, match="notes.txt"):
        FS.bbh_fewshot("just some notes\nwith no exemplars", 3, "notes.txt")


def test_load_bbh_fewshot_names_a_task_without_its_cot_prompt(tmp_path):
    (tmp_path / "bbh" / "cot-prompts").mkdir(parents=True)
    (tmp_path / "bbh" / "cot-prompts" / "sports_understanding.txt").write_text(SPORTS.read_text(encoding="utf-8"))
    got = D.load_bbh_fewshot(tmp_path, ["sports_understanding"], 3)
    prefix, suffix = got[("bbh", "sports_understanding")]
    assert FS.fewshot_prompt(prefix, QUESTION, suffix) == SPORTS_PROMPT
    with pytest.raises(D.DataError, match=r"bbh/navigate: cot.fewshot=3 needs its 3-shot CoT prompt file .*navigate.txt"):
        D.load_bbh_fewshot(tmp_path, ["sports_understanding", "navigate"], 3)


# Two exemplars written like exemplars.py's German and English entries (texts shortened by hand).
DE = [
    {"q": "Frage: Roger hat 5 Bälle. Wie viele hat er?", "a": "Schritt-für-Schritt-Antwort: 5 + 6 = 11. Die Antwort ist 11."},
    {"q": "Frage: Es waren 9 Computer. Wie viele sind es?", "a": "Schritt-für-Schritt-Antwort: 9 + 20 = 29. Die Antwort ist 29."},
]  # fmt: skip
EN = [
    {"q": "Question: Roger has 5 balls. How many does he have?", "a": "Step-by-Step Answer: 5 + 6 = 11. The answer is 11."},
    {"q": "Question: There were 9 computers. How many are there?", "a": "Step-by-Step Answer: 9 + 20 = 29. The answer is 29."},
]  # fmt: skip
ZH = [{"q": "问题：罗杰有 5 个网球。", "a": "逐步解答：5 + 6 = 11。答案是 11。"}]


def test_mgsm_fewshot_native_and_english_frames():
    question = "Janets Enten legen 16 Eier pro Tag. Wie viel Dollar nimmt sie ein?"
    prefix, suffix = FS.mgsm_fewshot(DE, 2)
    assert FS.fewshot_prompt(prefix, question, suffix) == (
        "Frage: Roger hat 5 Bälle. Wie viele hat er?\nSchritt-für-Schritt-Antwort: 5 + 6 = 11. Die Antwort ist 11.\n\n"
        "Frage: Es waren 9 Computer. Wie viele sind es?\nSchritt-für-Schritt-Antwort: 9 + 20 = 29. Die Antwort ist 29.\n\n"
        "Frage: Janets Enten legen 16 Eier pro Tag. Wie viel Dollar nimmt sie ein?\nSchritt-für-Schritt-Antwort:"
    )
    prefix, suffix = FS.mgsm_fewshot(EN, 1)
    assert FS.fewshot_prompt(prefix, question, suffix) == (
        "Question: Roger has 5 balls. How many does he have?\nStep-by-Step Answer: 5 + 6 = 11. The answer is 11.\n\n"
        "Question: Janets Enten legen 16 Eier pro Tag. Wie viel Dollar nimmt sie ein?\nStep-by-Step Answer:"
    )
    # Full-width colon and no space after it (zh, ja): the frame is read from the exemplars, not assumed.
    assert FS.mgsm_frame(ZH) == ("问题：", "逐步解答：")


def test_mgsm_fewshot_refuses_mixed_frames_and_too_many_shots():
    with pytest.raises(FS.FewshotError, match="several frames"):
        FS.mgsm_fewshot([DE[0], EN[0]], 2)
    with pytest.raises(FS.FewshotError, match="there are 2 exemplars"):
        FS.mgsm_fewshot(DE, 3)


def test_config_fewshot_default_zero_departure_and_bbh_cap():
    assert CotSettings().fewshot == 0 and CotSettings().departures() == {}
    assert CotSettings().fewshot_keys() == {}
    three = CotSettings(fewshot=3)
    assert three.departures() == {"fewshot": (3, 0), "mgsm_exemplars": ("native", None)}
    assert CotSettings(fewshot=8, datasets=["mgsm"]).fewshot == 8
    with pytest.raises(ValueError, match="hold 3 exemplars per task"):
        CotSettings(fewshot=5, datasets=["bbh", "mgsm"])


@pytest.mark.dataset("bbh")
def test_every_bbh_cot_prompt_parses_and_three_shots_are_the_file_verbatim():
    fewshot = D.load_bbh_fewshot(ROOT, D.BBH_TASKS, 3)
    assert len(fewshot) == 27
    for task in D.BBH_TASKS:
        body = (ROOT / "bbh" / "cot-prompts" / f"{task}.txt").read_text(encoding="utf-8").split("\n-----\n", 1)[1]
        prefix, suffix = fewshot[("bbh", task)]
        assert prefix == body.strip() + "\n\nQ: " and suffix == "\nA: Let's think step by step.\n", task


@pytest.mark.dataset("mgsm")
def test_load_mgsm_fewshot_native_vs_english_for_german():
    native = D.load_mgsm_fewshot(ROOT, ["de"], 8, "native")[("mgsm", "de")]
    english = D.load_mgsm_fewshot(ROOT, ["de"], 8, "english")[("mgsm", "de")]
    assert native[0].startswith(
        "Frage: Roger hat 5 Tennisbälle. Er kauft noch 2 Dosen Tennisbälle. In jeder Dose sind 3 Tennisbälle. "
        "Wie viele Tennisbälle hat er jetzt?\nSchritt-für-Schritt-Antwort: Roger begann mit 5 Bällen. 2 Dosen von "
        "jeweils 3 Tennisbällen macht 6 Tennisbälle. 5 + 6 = 11. Die Antwort ist 11.\n\nFrage: "
    )
    assert native[0].endswith("\n\nFrage: ") and native[1] == "\nSchritt-für-Schritt-Antwort:"
    assert native[0].count("\nSchritt-für-Schritt-Antwort: ") == 8
    assert english[0].startswith(
        "Question: Roger has 5 tennis balls. He buys 2 more cans of tennis balls. Each can has 3 tennis balls. "
        "How many tennis balls does he have now?\nStep-by-Step Answer: Roger started with 5 balls. 2 cans of 3 "
        "tennis balls each is 6 tennis balls. 5 + 6 = 11. The answer is 11.\n\nQuestion: "
    )
    assert english[0].endswith("\n\nQuestion: ") and english[1] == "\nStep-by-Step Answer:"
    # Every language's exemplars share one frame (else mgsm_frame would refuse them).
    table = json.loads((ROOT / "mgsm" / "mgsm_exemplars.json").read_text(encoding="utf-8"))["MGSM_EXEMPLARS"]
    assert set(D.load_mgsm_fewshot(ROOT, list(table), 3, "native")) == {("mgsm", lang) for lang in table}
