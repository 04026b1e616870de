"""udfs.nli training maths: label order, the distillation loss and the KL distance, against hand-derived values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from udfs import nli


def test_to_logit_order_places_each_label_at_its_index():
    canonical = np.array([[0.7, 0.2, 0.1]])  # entail, neutral, contradiction
    # tiny NLI model: NEUTRAL 0, Contradiction 1, entailment 2 -> indices (2, 0, 1)
    np.testing.assert_array_equal(nli.to_logit_order(canonical, (2, 0, 1)), [[0.2, 0.1, 0.7]])
    back = nli.to_logit_order(canonical, (2, 0, 1))[:, [2, 0, 1]]
    np.testing.assert_array_equal(back, canonical)


def test_distill_loss_hand_computed():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))  # student probabilities 1/2, 1/4, 1/4
    labels = torch.tensor([0])
    teacher = torch.tensor([[0.25, 0.5, 0.25]])
    ce = -math.log(0.5)
    kl = 0.25 * math.log(0.25 / 0.5) + 0.5 * math.log(0.5 / 0.25)  # KL(teacher || student) = 0.25 ln 2
    assert float(nli.distill_loss(logits, labels, None, 1.0)) == pytest.approx(ce, rel=1e-6)
    assert float(nli.distill_loss(logits, labels, teacher, 1.0)) == pytest.approx(kl, rel=1e-6)
    assert float(nli.distill_loss(logits, labels, teacher, 0.25)) == pytest.approx(0.25 * kl + 0.75 * ce, rel=1e-6)
    # no gold label (-100): the teacher alone, whatever alpha says
    assert float(nli.distill_loss(logits, torch.tensor([-100]), teacher, 0.25)) == pytest.approx(kl, rel=1e-6)
    # a student equal to its teacher has nothing left to learn
    assert float(nli.distill_loss(torch.log(teacher), labels, teacher, 1.0)) == pytest.approx(0.0, abs=1e-7)


def test_mean_kl_hand_computed():
    p = np.array([[0.25, 0.5, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    assert nli.mean_kl(p, q) == pytest.approx(0.25 * math.log(2) / 2, rel=1e-12)
