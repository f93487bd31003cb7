"""sentcl.training.selection: which checkpoint folder the export releases (``choose_checkpoint``, pure)."""

from __future__ import annotations

import pytest

from sentcl.training.selection import choose_checkpoint


def test_checkpoint_choice_prefers_dev_then_file_order_and_skips_missing_folders():
    sts = {
        "base": {"stsb_dev": 80.0},
        "a": {"stsb_dev": 81.0},
        "b": {"stsb_dev": 81.0},
        "c": {"stsb_dev": 90.0},
    }
    assert choose_checkpoint(sts, {"base", "a", "b"}, 1.0) == "a"
    with_domain = {
        "base": {"stsb_dev": 80.0, "domain_spearman": 70.0},
        "a": {"stsb_dev": 81.0, "domain_spearman": 60.0},
    }
    assert choose_checkpoint(with_domain, {"base", "a"}, 1.0) == "base"  # (80+70)/2 > (81+60)/2
    with pytest.raises(LookupError):
        choose_checkpoint(sts, set(), 1.0)


def test_checkpoint_choice_skips_a_checkpoint_whose_sick_trial_falls_past_the_gates_guard():
    # the make run's case: the best STS-B dev lost 1.76 on SICK-R trial against the model it started from
    sts = {
        "base": {"stsb_dev": 86.72, "sick_dev": 79.80},
        "distilled": {"stsb_dev": 87.09, "sick_dev": 80.38},
        "contrastive": {"stsb_dev": 87.31, "sick_dev": 78.04},
        "no_sick": {"stsb_dev": 99.0},
    }
    every = set(sts)
    assert choose_checkpoint(sts, every, 1.0) == "distilled"
    assert choose_checkpoint(sts, every, 2.0) == "contrastive"  # 78.04 >= 79.80 - 2.0
    sts["contrastive"]["sick_dev"] = 78.80  # exactly max_dev_drop below: allowed, as in the gate
    assert choose_checkpoint(sts, every, 1.0) == "contrastive"
    del sts["base"]["sick_dev"]  # no reference score: nothing to guard
    assert choose_checkpoint(sts, every, 1.0) == "no_sick"
    sts["base"]["sick_dev"] = 99.0  # every trained checkpoint past the guard: the base itself ships
    assert choose_checkpoint(sts, every - {"no_sick"}, 1.0) == "base"
