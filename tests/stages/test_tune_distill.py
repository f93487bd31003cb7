"""``benchmarks.tune_distill`` chooses the distillation recipe on the declared selection sets only (never a test
pair, never a train pair: no tuning set under another name), and its choice rule keeps the cheaper variant unless a
costlier one wins by more than the seed spread."""

import pandas as pd
import pytest

from benchmarks.tune_distill import choose, parse_variant, summarise, tuning_sets


def test_tuning_sets_are_the_selection_sets_and_nothing_else():
    rows = [
        ("STSb", "dev", "d1", "d2", 1.0),
        ("SICK-R", "dev", "t1", "t2", 2.0),
        ("SICK-R", "dev", "A b.", "c d", 2.5),  # the same pair as a SICK-R test pair: left out of selection
        ("STSb", "train", "a", "b", 3.0),  # a train pair: never a tuning set (most are STS12-16 test pairs)
        ("STSb", "test", "a", "b", 0.5),
        ("SICK-R", "test", "C D", "a b", 0.7),
        ("STS12", "test", "x", "y", 0.7),
    ]
    pairs = pd.DataFrame(rows, columns=["task", "split", "sentence1", "sentence2", "score"])
    assert tuning_sets(pairs) == {"stsb_dev": [("d1", "d2", 1.0)], "sick_trial": [("t1", "t2", 2.0)]}


def _runs(gains: list[tuple[float, float]], cpu: float) -> list[dict]:
    return [
        {"seed": 42 + i, "gains": {"stsb_dev": a, "sick_trial": b}, "wall_s": cpu, "cpu_s": cpu}
        for i, (a, b) in enumerate(gains)
    ]


def test_a_variant_list_value_keeps_its_commas():
    name, overrides = parse_variant(
        "frz:transfer.distillation.freeze=[embeddings,encoder.layer.0],transfer.distillation.steps=300"
    )
    assert name == "frz"
    assert overrides == {
        "transfer.distillation.freeze": ["embeddings", "encoder.layer.0"],
        "transfer.distillation.steps": 300,
    }
    assert parse_variant("default:") == ("default", {})


def test_summary_is_the_mean_sd_and_range_over_seeds():
    summary = summarise(_runs([(1.0, 0.0), (0.8, 0.4), (0.6, 0.2)], 100.0))
    # selection gains (mean of the two sets): 0.5, 0.6, 0.4
    assert summary["selection_gain"]["mean"] == pytest.approx(0.5)
    assert summary["selection_gain"]["sd"] == pytest.approx(0.1)
    assert summary["spread"] == pytest.approx(0.2)
    assert summary["gains"]["stsb_dev"]["mean"] == pytest.approx(0.8)
    assert summary["cpu_s"] == 100.0 and summary["seeds"] == [42, 43, 44]


def test_a_costlier_variant_must_win_by_more_than_the_seed_spread():
    cheap = summarise(_runs([(0.8, 0.2), (0.9, 0.3), (0.7, 0.1)], 600.0))  # 0.5, 0.6, 0.4: spread 0.2
    narrow = summarise(
        _runs([(1.0, 0.4), (1.1, 0.4), (1.0, 0.3)], 1200.0)
    )  # 0.7, 0.75, 0.65: +0.2, spread 0.1
    clear = summarise(_runs([(1.4, 0.6), (1.5, 0.5), (1.4, 0.5)], 2400.0))  # 1.0, 1.0, 0.95: +0.48 over cheap
    best, lines = choose({"long": narrow, "short": cheap})
    assert best == "short"
    assert lines == [
        "short: +0.50, -0.20 from the best (long) against a seed spread of 0.20, 600 cpu_s: chosen",
        "long: +0.70, +0.00 from the best (long) against a seed spread of 0.10, 1200 cpu_s: as good, costlier",
    ]
    best, lines = choose({"short": cheap, "long": narrow, "longer": clear})
    assert best == "longer"  # both cheaper ones fall short of it by more than 0.20
    assert lines[0].endswith(
        "-0.48 from the best (longer) against a seed spread of 0.20, 600 cpu_s: short of it"
    )


def test_the_choice_is_the_same_in_any_order_and_never_costs_more_for_less():
    """Three seeds each, as the steps were measured: 200 steps +0.55 (range 0.10), 300 steps +0.85 (0.35), 400
    steps +0.77 (0.09). Replacing a running choice pairwise picked 400 (it beats 200 by more than 200's and its own
    range), although 300 costs less and scores more. Measured against the best, 300 steps, with their larger range
    (0.375), 200 steps is within it, and cheapest."""
    from itertools import permutations

    variants = {
        "s200": summarise(_runs([(0.50, 0.50), (0.60, 0.50), (0.60, 0.60)], 360.0)),  # 0.50, 0.55, 0.60
        "s300": summarise(_runs([(0.95, 1.00), (0.60, 0.60), (1.00, 0.90)], 550.0)),  # 0.975, 0.60, 0.95
        "s400": summarise(_runs([(0.80, 0.80), (0.70, 0.70), (0.80, 0.80)], 775.0)),  # 0.80, 0.70, 0.80
    }
    for order in permutations(variants):
        assert choose({name: variants[name] for name in order})[0] == "s200"
    # Without 200 steps: 300 (best, cheaper) over 400.
    assert choose({"s400": variants["s400"], "s300": variants["s300"]})[0] == "s300"


def test_a_noisy_variant_does_not_loosen_the_bar_between_two_others():
    """The best (+0.8) beats the cheap variant (+0.5) by more than either's range (0.1): the best is kept, whatever
    range a third variant has. With one spread for all (the largest range, 0.8), the cheap one had been chosen."""
    cheap = summarise(_runs([(0.5, 0.5), (0.55, 0.55), (0.45, 0.45)], 100.0))
    best = summarise(_runs([(0.8, 0.8), (0.85, 0.85), (0.75, 0.75)], 200.0))
    noisy = summarise(_runs([(0.3, 0.3), (0.7, 0.7), (-0.1, -0.1)], 300.0))  # +0.3, range 0.8
    choice, lines = choose({"cheap": cheap, "best": best, "noisy": noisy})
    assert choice == "best"
    assert lines[0].startswith("cheap: +0.50, -0.30 from the best (best) against a seed spread of 0.10")
    assert lines[2].endswith("300 cpu_s: as good, costlier")  # within its own range of the best, and dearer


def test_variants_at_the_same_price_go_by_their_mean():
    first = summarise(_runs([(0.5, 0.5), (0.6, 0.6), (0.4, 0.4)], 100.0))  # 0.5, spread 0.2
    second = summarise(_runs([(0.6, 0.6), (0.7, 0.7), (0.5, 0.5)], 105.0))  # 0.6: 5% dearer, the same price
    # 0.6 for 30% more: not the same price
    dear = summarise(_runs([(0.6, 0.6), (0.7, 0.7), (0.5, 0.5)], 130.0))
    best, lines = choose({"first": first, "second": second})
    assert best == "second" and lines[0].endswith("100 cpu_s: as good, the same price, not the best mean")
    assert choose({"first": first, "dear": dear})[0] == "first"
    twin = summarise(_runs([(0.5, 0.5), (0.6, 0.6), (0.4, 0.4)], 104.0))  # first's scores, 4% dearer
    assert choose({"twin": twin, "first": first})[0] == "first"  # a tie at one price: the cheaper


def test_interpolated_weights_are_the_init_plus_a_times_the_change(tmp_path):
    """WiSE-FT's arithmetic, read back from the saved files: init + a (trained - init) for every float tensor."""
    from safetensors.torch import load_file

    from benchmarks.tune_distill import interpolate
    from tests.tiny import make_tiny_encoder

    init = make_tiny_encoder(tmp_path, "init", seed=1)
    trained = make_tiny_encoder(tmp_path, "trained", seed=2)
    start, end = load_file(init / "model.safetensors"), load_file(trained / "model.safetensors")
    for weight in (0.5, 2.0):
        mixed = load_file(
            interpolate(str(init), trained, weight, tmp_path / f"mix-{weight}") / "model.safetensors"
        )
        assert set(mixed) == set(start)
        for key, value in start.items():
            if value.is_floating_point():
                expected = value.double() + weight * (end[key].double() - value.double())
                assert (mixed[key].double() - expected).abs().max() < 1e-5, key
            else:
                assert (mixed[key] == value).all(), key


def test_a_variant_pays_for_the_teacher_vectors_of_its_own_text(tmp_path):
    """The cost the rule weighs is training plus the teacher's encoding of the text the variant trains on, at the
    CPU rate the teacher stage recorded: a variant on half the text pays half the teacher's seconds."""
    import json

    from benchmarks.tune_distill import teacher_cost, teacher_rate

    (tmp_path / "teacher.json").write_text(
        json.dumps({"model": "m", "sentences": 400, "encode_seconds": 60.0, "encode_cpu_seconds": 100.0})
    )
    rate = teacher_rate(tmp_path)
    assert rate == pytest.approx(0.25)
    text = tmp_path / "text.txt"
    text.write_text("".join(f"sentence number {i} of the domain .\n" for i in range(300)))
    empty = pd.DataFrame(columns=["task", "split", "sentence1", "sentence2", "score"])
    params = {"seed": 42, "transfer": {"texts": str(text), "max_texts": "all"}}
    assert teacher_cost(params, rate, empty, empty) == (300, 75.0)
    params["transfer"]["max_texts"] = 120
    assert teacher_cost(params, rate, empty, empty) == (120, 30.0)
    runs = [
        {**r, "teacher_cpu_s": t}
        for r, t in zip(_runs([(0.5, 0.5)] * 3, 100.0), (30.0, 30.0, 30.0), strict=True)
    ]
    summary = summarise(runs)
    assert (summary["cpu_s"], summary["teacher_cpu_s"], summary["cost_cpu_s"]) == (100.0, 30.0, 130.0)
    # a record from before the CPU field: wall seconds on every core, never less than the truth
    (tmp_path / "teacher.json").write_text(
        json.dumps({"model": "m", "sentences": 400, "encode_seconds": 60.0})
    )
    assert teacher_rate(tmp_path) >= 60.0 / 400


def test_a_cheap_run_on_costly_teacher_vectors_is_not_the_cheap_choice():
    """Training seconds alone would choose the short run on the whole text; with the teacher's seconds counted, the
    run on a sample that scores as well is cheaper."""
    whole = summarise([{**r, "teacher_cpu_s": 550.0} for r in _runs([(0.7, 0.7)] * 3, 300.0)])
    sample = summarise([{**r, "teacher_cpu_s": 250.0} for r in _runs([(0.7, 0.7)] * 3, 360.0)])
    assert choose({"whole": whole, "sample": sample})[0] == "whole"  # training seconds only
    assert choose({"whole": whole, "sample": sample}, cost="cost_cpu_s")[0] == "sample"
