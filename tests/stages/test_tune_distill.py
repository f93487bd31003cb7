"""``benchmarks.tune_distill`` chooses the distillation recipe on tuning data: it must never hand a test pair to the
comparison, and its "seen" set is the STS-B train pairs whose two sentences were both trained on."""

import pandas as pd

from benchmarks.tune_distill import tuning_sets


def test_tuning_sets_hold_dev_splits_and_seen_train_pairs_only():
    rows = [
        ("STSb", "dev", "d1", "d2", 1.0),
        ("SICK-R", "dev", "t1", "t2", 2.0),
        ("STSb", "train", "a", "b", 3.0),  # both trained: seen
        ("STSb", "train", "a", "z", 4.0),  # one trained: not seen
        ("STSb", "train", "y", "z", 5.0),  # neither
        ("STSb", "test", "a", "b", 0.5),  # a test pair of trained sentences: never read
        ("SICK-R", "test", "a", "b", 0.7),
        ("SICK-R", "train", "a", "b", 0.9),  # SICK train is not a tuning set here
    ]
    pairs = pd.DataFrame(rows, columns=["task", "split", "sentence1", "sentence2", "score"])
    sets = tuning_sets(pairs, trained={"a", "b", "y"})
    assert sets == {
        "stsb_dev": [("d1", "d2", 1.0)],
        "sick_trial": [("t1", "t2", 2.0)],
        "stsb_train_seen": [("a", "b", 3.0)],
    }


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
