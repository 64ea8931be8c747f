"""Calibration observers: PaddleSlim's algorithms turn batches of samples into int8 scales."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from paddlejax.slim.quant.observers import OBSERVERS, make_observer, quant_error


def observed(algo, *batches, **options):
    obs = make_observer(algo, **options)
    for batch in batches:
        obs.observe(batch)
    return obs


@pytest.fixture(scope="module")
def gaussian_with_outliers():
    """A million N(0, 1) samples, three of them replaced by outliers at +-40."""
    x = np.random.default_rng(0).normal(size=1_000_000).astype(np.float32)
    x[:3] = [40.0, -40.0, 40.0]
    return x


def test_the_registry_knows_paddleslims_names():
    assert sorted(OBSERVERS) == sorted(["abs_max", "channel_wise_abs_max", "moving_average_abs_max", "min_max",
                                        "avg", "hist", "KL", "mse"])
    assert make_observer("kl").name == "KL"
    assert make_observer("abs_max") is not make_observer("abs_max")


def test_abs_max_is_the_largest_magnitude_over_all_batches():
    obs = observed("abs_max", np.array([0.5, -2.0]), np.array([[1.5, -0.25]]))
    assert obs.scale() == np.float32(2.0)
    assert obs.scale().shape == () and obs.scale().dtype == np.float32
    assert obs.batches == 2


def test_abs_max_per_channel_along_any_axis():
    x = np.array([[1.0, -4.0, 0.5], [-2.0, 0.5, 0.25]])
    np.testing.assert_array_equal(observed("abs_max", x, axis=1).scale(), [2.0, 4.0, 0.5])
    np.testing.assert_array_equal(observed("abs_max", x, axis=-2).scale(), [4.0, 2.0])
    both = observed("abs_max", x, 3 * x, axis=1)
    np.testing.assert_array_equal(both.scale(), [6.0, 12.0, 1.5])


def test_channel_wise_abs_max_gives_one_scale_per_output_channel():
    conv = np.zeros((3, 2, 3, 3), np.float32)  # OIHW
    conv[0, 1, 2, 2], conv[1, 0, 0, 0], conv[2, 1, 1, 0] = -0.5, 2.0, 0.125
    np.testing.assert_array_equal(observed("channel_wise_abs_max", conv).scale(), [0.5, 2.0, 0.125])
    linear = np.array([[1.0, -3.0], [0.5, 0.25], [-2.0, 0.0]])  # [in, out]
    np.testing.assert_array_equal(observed("channel_wise_abs_max", linear, axis=1).scale(), [2.0, 3.0])


def test_moving_average_abs_max_follows_the_formula_over_three_batches():
    batches = [np.array([1.0, -0.5]), np.array([-3.0]), np.array([2.0, 1.0])]  # maxima 1, 3, 2
    # accum = 0.9 * accum + max, state = 0.9 * state + 1, scale = accum / state
    accum = (0.9 * 0.9 * 1.0) + (0.9 * 3.0) + 2.0
    state = 0.9 * 0.9 + 0.9 + 1.0
    assert observed("moving_average_abs_max", *batches).scale() == pytest.approx(accum / state, rel=1e-6)
    assert observed("moving_average_abs_max", *batches[:1]).scale() == 1.0
    assert observed("moving_average_abs_max", *batches, rate=0.0).scale() == 2.0  # only the last batch


def test_avg_is_the_mean_of_the_batch_maxima():
    obs = observed("avg", np.array([1.0, -2.0]), np.array([4.0]), np.array([-0.5, 0.25]))
    assert obs.scale() == pytest.approx((2.0 + 4.0 + 0.5) / 3)


def test_min_max_keeps_the_range_for_asymmetric_activations():
    obs = observed("min_max", np.array([0.5, 2.0]), np.array([[-1.0, 0.0]]))
    assert obs.range() == (-1.0, 2.0)
    assert obs.scale() == 2.0
    assert observed("min_max", np.array([1.0, 3.0])).range() == (1.0, 3.0)  # a ReLU output


def test_jax_arrays_of_any_float_dtype_are_observed():
    obs = observed("abs_max", jnp.array([1.0, -3.5], jnp.bfloat16), jnp.ones((2, 2)))
    assert obs.scale() == 3.5


def test_hist_percentile_of_uniform_samples_matches_the_analytic_value():
    x = np.random.default_rng(0).uniform(-2.0, 2.0, size=1_000_000).astype(np.float32)
    # |x| is uniform on [0, 2]: its p-quantile is 2p.
    assert observed("hist", x, percentile=0.999).scale() == pytest.approx(2 * 0.999, rel=0.01)
    assert observed("hist", x, percentile=0.9).scale() == pytest.approx(2 * 0.9, rel=0.01)
    assert observed("hist", x).scale() == pytest.approx(2 * 0.99999, rel=0.01)


def test_hist_threshold_is_the_centre_of_the_bin_reaching_the_percentile():
    x = np.array([0.1, 0.2, 0.3, 3.9, 4.0])  # 4 bins of width 1: counts 3, 0, 0, 2
    assert observed("hist", x, bins=4, percentile=0.6).scale() == 0.5
    assert observed("hist", x, bins=4, percentile=0.61).scale() == 3.5


@pytest.mark.parametrize("algo", ["hist", "KL", "mse"])
def test_rare_huge_outliers_are_clipped_by_the_histogram_algorithms(algo, gaussian_with_outliers):
    assert observed("abs_max", gaussian_with_outliers).scale() == 40.0
    assert observed(algo, gaussian_with_outliers).scale() <= 20.0 + 40 / 2048


def test_kl_clips_a_gaussian_with_outliers_inside_the_max_and_beats_abs_max(gaussian_with_outliers):
    x = gaussian_with_outliers
    kl = observed("KL", x, start=0.0).scale()
    assert 3.0 < kl < 10.0  # the bulk of N(0, 1) is kept, the outliers at 40 are clipped
    assert quant_error(x, kl) < 0.6 * quant_error(x, 40.0)
    # PaddleSlim's search never clips below half the max
    assert observed("KL", x).scale() == pytest.approx(20.0, abs=40 / 2048)


def tensorrt_kl_threshold(hist, width, levels):
    """TensorRT's entropy calibration written as plain loops, to check the vectorised search."""
    best = None
    for stop in range(levels, len(hist) + 1):
        p = list(hist[:stop])
        p[-1] += sum(hist[stop:])
        group = stop // levels
        q = [0.0] * stop
        for level in range(levels):
            lo, hi = level * group, (stop if level == levels - 1 else (level + 1) * group)
            used = [j for j in range(lo, hi) if p[j] > 0]
            for j in used:
                q[j] = sum(hist[lo:hi]) / len(used)
        if sum(q) == 0:
            continue
        q = [1e-4 if pj > 0 and qj == 0 else qj for pj, qj in zip(p, q)]
        p_sum, q_sum = sum(p), sum(q)
        kl = sum(pj / p_sum * math.log(pj / p_sum / (qj / q_sum)) for pj, qj in zip(p, q) if pj > 0)
        if best is None or kl < best[0]:
            best = (kl, stop)
    return best[1] * width


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_search_matches_tensorrts_algorithm(seed):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.laplace(size=3000), rng.uniform(5, 9, size=seed * 4)])
    obs = observed("KL", x, bits=4, bins=64, start=0.0)  # 8 quantization levels, every clip tried
    hist, top = obs.histogram()
    assert obs.scale() == pytest.approx(tensorrt_kl_threshold(hist, top / 64, 8), rel=1e-6)


def test_mse_threshold_minimises_the_quantization_error_of_a_brute_force_grid(gaussian_with_outliers):
    x = gaussian_with_outliers
    grid = np.arange(1.0, 40.5, 0.5)
    for bits in (8, 4):
        errors = np.array([quant_error(x, t, bits=bits) for t in grid])
        best = observed("mse", x, bits=bits).scale()
        assert quant_error(x, best, bits=bits) <= errors.min() * 1.001
        assert abs(best - grid[errors.argmin()]) <= 0.5
    # Four-bit steps are coarse: the best clip sits lower (about 2.5 against 15 for int8).
    assert observed("mse", x, bits=4).scale() < 0.5 * observed("mse", x).scale()


@pytest.mark.parametrize("algo", ["hist", "KL", "mse"])
def test_a_growing_range_matches_one_histogram_of_all_the_data(algo):
    rng = np.random.default_rng(0)
    batches = [rng.normal(scale=s, size=50_000).astype(np.float32) for s in (0.25, 0.5, 1.0, 2.0)]
    everything = np.concatenate(batches)
    grown = observed(algo, *batches, percentile=0.999) if algo == "hist" else observed(algo, *batches)
    once = observed(algo, everything, percentile=0.999) if algo == "hist" else observed(algo, everything)
    (grown_hist, grown_max), (once_hist, once_max) = grown.histogram(), once.histogram()
    assert grown_max == once_max == np.abs(everything).max()
    assert grown_hist.sum() == pytest.approx(everything.size)
    # Re-binned counts move by less than a bin: the cumulative counts (what percentiles read) agree.
    assert np.abs(np.cumsum(grown_hist) - np.cumsum(once_hist)).max() < 1e-3 * everything.size
    assert abs(grown.scale() - once.scale()) <= once_max / 2048
    assert quant_error(everything, grown.scale()) == pytest.approx(quant_error(everything, once.scale()), rel=0.01)


def test_rebinning_spreads_counts_uniformly_within_old_bins():
    obs = observed("hist", np.array([0.1, 0.9, 1.0, 1.0]), bins=2)  # bins [0, .5], [.5, 1]: 1, 3
    obs.observe(np.array([4.0]))  # range grows to [0, 4]: bins [0, 2], [2, 4]
    np.testing.assert_allclose(obs.histogram()[0], [4.0, 1.0])
    obs.observe(np.array([5.0]))  # [0, 2.5] takes 4 + 1 * (0.5 / 2) of the old counts
    np.testing.assert_allclose(obs.histogram()[0], [4.25, 1.75])


@pytest.mark.parametrize("algo", sorted(OBSERVERS))
def test_all_zero_data_gives_a_zero_scale(algo):
    obs = observed(algo, np.zeros((2, 3)), np.zeros((2, 3)))
    np.testing.assert_array_equal(obs.scale(), np.zeros(2 if algo == "channel_wise_abs_max" else ()))
    assert quant_error(np.ones(3), 0.0) == 1.0  # a zero scale quantizes everything to 0


@pytest.mark.parametrize("algo", ["hist", "KL", "mse"])
def test_zeros_before_the_first_non_zero_batch_stay_in_the_first_bin(algo):
    obs = observed(algo, np.zeros(5), np.array([1.0, 2.0]), bins=256)
    hist, top = obs.histogram()
    assert top == 2.0 and hist[0] == 5.0 and hist.sum() == 7.0


def test_quant_error_of_known_values():
    assert quant_error(np.array([-1.0, 0.0, 1.0]), 1.0) == 0.0
    assert quant_error(np.array([3.0]), 1.0) == 4.0  # clipped to the scale
    assert quant_error(np.array([0.5]), 7.0, bits=4) == 0.25  # step 1: rounds half to even, to 0
    per_channel = np.array([[0.5, 2.0], [1.0, -2.0]])
    assert quant_error(per_channel, np.array([1.0, 2.0]), axis=1) == pytest.approx(
        np.mean([(0.5 - 64 / 127) ** 2, 0.0, 0.0, 0.0]))


def test_errors_name_the_problem():
    with pytest.raises(RuntimeError, match="observed no data"):
        make_observer("hist").scale()
    with pytest.raises(RuntimeError, match="observed no data"):
        make_observer("min_max").range()
    with pytest.raises(ValueError, match="2 non-finite"):
        make_observer("abs_max").observe(np.array([1.0, np.nan, np.inf]))
    with pytest.raises(ValueError, match=r"x is empty \(shape \(0, 3\)\)"):
        make_observer("KL").observe(np.zeros((0, 3)))
    with pytest.raises(ValueError, match=r"channel axis 2 is out of range for x of rank 2"):
        make_observer("channel_wise_abs_max", axis=2).observe(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"channel axis 0 is out of range for x of rank 0"):
        make_observer("abs_max", axis=0).observe(np.float32(1.0))
    with pytest.raises(ValueError, match="x has 4 channels along axis 0, earlier batches had 3"):
        observed("channel_wise_abs_max", np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(TypeError, match="real numbers, got dtype bool"):
        make_observer("avg").observe(np.array([True]))
    with pytest.raises(TypeError, match="symmetric.*use the min_max observer"):
        observed("hist", np.ones(3)).range()


def test_bad_names_and_options_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown observer algo 'max'; known: abs_max, .*, mse"):
        make_observer("max")
    with pytest.raises(TypeError, match="the hist observer has no option 'rate'; its options: percentile, bins"):
        make_observer("hist", rate=0.9)
    with pytest.raises(ValueError, match=r"percentile must be in \(0, 1\], got 0"):
        make_observer("hist", percentile=0)
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\], got 2"):
        make_observer("moving_average_abs_max", rate=2)
    with pytest.raises(ValueError, match=r"bits must be in \[2, 16\], got 1"):
        make_observer("mse", bits=1)
    with pytest.raises(ValueError, match="bins must be >= 128, got 64"):
        make_observer("KL", bins=64)
    with pytest.raises(TypeError, match="axis must be an int, got None"):
        make_observer("channel_wise_abs_max", axis=None)
    with pytest.raises(ValueError, match=r"scale must have shape \(2,\) for axis 1"):
        quant_error(np.ones((3, 2)), np.ones(3), axis=1)
    with pytest.raises(ValueError, match="per-channel scale .* needs the channel axis"):
        quant_error(np.ones((3, 2)), np.ones(2))
