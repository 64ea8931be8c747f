"""DataLoader: what batches it yields, in what order, on which devices, and how it resumes."""
import json
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paddlejax.data import DataLoader

X = np.arange(30, dtype=np.float32).reshape(10, 3)
Y = np.arange(10, dtype=np.int32)


class Samples:
    """A map-style dataset over X, Y returning tuple (or dict) samples."""

    def __init__(self, as_dict=False):
        self.as_dict = as_dict

    def __len__(self):
        return len(Y)

    def __getitem__(self, i):
        return {"x": X[i], "y": Y[i]} if self.as_dict else (X[i], Y[i])


class Broken(Samples):
    def __getitem__(self, i):
        if i == 3:
            raise ValueError("sample 3 is corrupt")
        return super().__getitem__(i)


def host(batches):
    """Batches as nested lists, comparable with ==."""
    return [jax.tree.map(np.asarray, b) for b in batches]


def labels(loader):
    return [np.asarray(y).tolist() for _, y in loader]


def test_every_sample_once_per_epoch_with_matching_rows():
    loader = DataLoader((X, Y), batch_size=4, shuffle=True)
    for _ in range(2):
        batches = host(loader)
        assert [len(y) for _, y in batches] == [4, 4, 2]
        seen = np.concatenate([y for _, y in batches])
        assert sorted(seen.tolist()) == list(range(10))
        np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), X[seen])


def test_without_shuffle_batches_are_in_order_and_the_last_is_partial():
    loader = DataLoader(Y, batch_size=4)
    assert len(loader) == 3
    assert [np.asarray(b).tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_drop_last_drops_the_partial_batch():
    loader = DataLoader((X, Y), batch_size=4, shuffle=True, drop_last=True)
    assert len(loader) == 2
    assert [len(y) for y in labels(loader)] == [4, 4]


def test_shuffle_differs_between_epochs_and_repeats_for_the_same_seed():
    a, b, other = (DataLoader((X, Y), batch_size=5, shuffle=True, seed=s) for s in (3, 3, 4))
    epochs_a = [labels(a) for _ in range(3)]
    assert epochs_a == [labels(b) for _ in range(3)]
    assert epochs_a[0] != epochs_a[1] != epochs_a[2]
    assert labels(other) != epochs_a[0]


def test_set_epoch_replays_an_epoch():
    loader = DataLoader((X, Y), batch_size=3, shuffle=True, seed=1)
    first, second = labels(loader), labels(loader)
    loader.set_epoch(1)
    assert labels(loader) == second
    loader.set_epoch(0)
    assert labels(loader) == first


def test_dict_arrays_give_dict_batches():
    batch = host(DataLoader({"x": X, "y": Y}, batch_size=4))[1]
    assert set(batch) == {"x", "y"}
    np.testing.assert_array_equal(batch["x"], X[4:8])
    np.testing.assert_array_equal(batch["y"], Y[4:8])


@pytest.mark.parametrize("as_dict", [False, True])
def test_map_style_dataset_with_worker_threads_matches_the_array_path(as_dict):
    arrays = DataLoader({"x": X, "y": Y} if as_dict else (X, Y), batch_size=4, shuffle=True, seed=5)
    samples = DataLoader(Samples(as_dict), batch_size=4, shuffle=True, seed=5, num_workers=2, prefetch=2)
    for _ in range(2):  # both epochs, each reshuffled alike on both paths
        got, expected = host(samples), host(arrays)
        assert jax.tree.structure(got) == jax.tree.structure(expected)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(g, e)


def test_custom_collate_receives_the_list_of_samples():
    def tens(samples):
        return np.array([y for _, y in samples]) * 10

    first = next(iter(DataLoader(Samples(), batch_size=4, collate=tens)))
    assert np.asarray(first).tolist() == [0, 10, 20, 30]


def test_objects_with_arrays_method_use_their_arrays():
    class WithArrays(Samples):
        def __getitem__(self, i):
            raise AssertionError("the fast path reads arrays(), not samples")

        def arrays(self):
            return X, Y

    assert labels(DataLoader(WithArrays(), batch_size=6)) == [list(range(6)), [6, 7, 8, 9]]


def test_strings_stay_on_the_host_and_numbers_go_to_device():
    texts = ["a", "bb", "ccc"]
    loader = DataLoader([(t, i) for i, t in enumerate(texts)], batch_size=3)
    words, ids = next(iter(loader))
    assert isinstance(words, np.ndarray) and words.tolist() == texts
    assert isinstance(ids, jax.Array) and ids.tolist() == [0, 1, 2]


@pytest.mark.parametrize("num_workers,device_prefetch", [(0, 0), (2, 2)])
def test_resume_mid_epoch_gives_the_batches_of_an_uninterrupted_run(num_workers, device_prefetch):
    def make(seed):
        return DataLoader((X, Y), batch_size=2, shuffle=True, seed=seed,
                          num_workers=num_workers, device_prefetch=device_prefetch)

    reference = make(11)
    uninterrupted = [y for _ in range(4) for y in labels(reference)]

    run = make(11)
    seen = labels(run) + labels(run)
    batches = iter(run)
    seen += [np.asarray(next(batches)[1]).tolist() for _ in range(3)]  # 2.6 epochs
    state = json.loads(json.dumps(run.state_dict()))
    assert state["epoch"] == 2 and state["position"] == 3

    resumed = make(0)  # the seed comes back with the state
    resumed.load_state_dict(state)
    rest = labels(resumed) + labels(resumed)
    assert seen + rest == uninterrupted


def test_abandoned_iteration_stops_its_thread_and_keeps_the_position():
    loader = DataLoader(Samples(), batch_size=2, num_workers=2, device_prefetch=2)
    for _ in loader:
        break
    assert not [t for t in threading.enumerate() if t.name == "paddlejax-device-prefetch"]
    assert loader.state_dict()["position"] == 1
    assert labels(loader) == [[2, 3], [4, 5], [6, 7], [8, 9]]


def test_interpreter_exits_with_an_iteration_left_open():
    code = (
        "import time, numpy as np\n"
        "from paddlejax.data import DataLoader\n"
        "class Slow:\n"
        "    def __len__(self): return 64\n"
        "    def __getitem__(self, i): time.sleep(0.01); return np.float32(i)\n"
        "batches = iter(DataLoader(Slow(), batch_size=2, num_workers=2, prefetch=4, device_prefetch=2))\n"
        "next(batches)\n"
        "print('done')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"


@pytest.mark.parametrize("num_workers,device_prefetch", [(0, 0), (0, 2), (2, 2)])
def test_dataset_errors_reach_the_consumer_unchanged(num_workers, device_prefetch):
    loader = DataLoader(Broken(), batch_size=2, num_workers=num_workers, device_prefetch=device_prefetch)
    with pytest.raises(ValueError, match="sample 3 is corrupt"):
        list(loader)


def test_batches_are_put_on_device_with_the_sharding():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    loader = DataLoader((X, Y), batch_size=8, shuffle=True, drop_last=True, sharding=sharding)
    x, y = next(iter(loader))
    assert x.sharding == sharding and y.sharding == sharding
    assert [s.data.shape for s in x.addressable_shards] == [(2, 3)] * 4
    np.testing.assert_array_equal(np.asarray(x), X[np.asarray(y)])


def test_batches_without_sharding_are_jax_arrays_on_the_default_device():
    x, y = next(iter(DataLoader((X, Y), batch_size=4, device_prefetch=0)))
    assert isinstance(x, jax.Array) and x.devices() == {jax.devices()[0]}


@pytest.mark.parametrize("dataset,kwargs,error,message", [
    ((X, Y[:7]), {}, ValueError, r"equal first dimensions, got lengths \[10, 7\]"),
    ({"x": X, "n": np.float32(1)}, {}, ValueError, r"needs a first \(sample\) dimension"),
    ((X, Y), {"batch_size": 0}, ValueError, "batch_size expects an int >= 1, got 0"),
    ((X, Y), {"batch_size": 2.0}, ValueError, "batch_size expects an int >= 1, got 2.0"),
    ([], {}, ValueError, "dataset is empty"),
    (np.zeros((0, 3)), {}, ValueError, "dataset is empty"),
    (object(), {}, TypeError, "__len__ and __getitem__, got object"),
    ((X, Y), {"batch_size": 16, "drop_last": True}, ValueError, "gives no batches"),
    ((X, Y), {"num_workers": -1}, ValueError, "num_workers expects an int >= 0"),
    ((X, Y), {"num_workers": "many"}, ValueError, "num_workers expects an int >= 0, got 'many'"),
    ((X, Y), {"sharding": "data"}, TypeError, "sharding expects a jax.sharding.Sharding"),
])
def test_bad_arguments_are_named(dataset, kwargs, error, message):
    with pytest.raises(error, match=message):
        DataLoader(dataset, **kwargs)


def test_load_state_dict_refuses_a_state_from_another_configuration():
    state = DataLoader((X, Y), batch_size=2).state_dict()
    with pytest.raises(ValueError, match="saved with batch_size=2, this loader has batch_size=3"):
        DataLoader((X, Y), batch_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match="position expects at most 5"):
        DataLoader((X, Y), batch_size=2).load_state_dict({**state, "position": 6})
    with pytest.raises(ValueError, match=r"lacks \['seed'\]"):
        DataLoader((X, Y), batch_size=2).load_state_dict({k: v for k, v in state.items() if k != "seed"})


class Waiting(Samples):
    """Samples that wait on I/O (a sleep releases the GIL, as a file read does)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import time

        time.sleep(0.003)
        return X[i % len(Y)], Y[i % len(Y)]


def test_auto_workers_are_measured_and_threads_win_when_samples_wait(caplog):
    import logging

    loader = DataLoader(Waiting(), batch_size=4, shuffle=True, seed=2, num_workers="auto")
    assert loader.autotune is None  # measured on the first iteration, not at construction
    with caplog.at_level(logging.INFO, logger="paddlejax.data"):
        batches = host(loader)
    report = loader.autotune
    assert list(report["batches_per_s"])[:3] == [0, 1, 2] and report["num_workers"] == loader.num_workers >= 2
    rates = report["batches_per_s"]
    assert rates[loader.num_workers] >= 0.95 * max(rates.values()) > 1.5 * rates[0]
    assert loader.prefetch == report["prefetch"] == max(2, 2 * loader.num_workers)
    assert "DataLoader autotune: num_workers=" in caplog.text
    # the measurement read ahead without using up the epoch: the same batches as a fixed loader
    fixed = DataLoader(Waiting(), batch_size=4, shuffle=True, seed=2, num_workers=2)
    assert str(batches) == str(host(fixed)) and len(batches) == 16
    host(loader)
    assert loader.autotune is report  # measured once


def test_auto_workers_for_arrays_are_measured_too():
    loader = DataLoader((X, Y), batch_size=2, num_workers="auto")
    assert [b[1].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert loader.num_workers in loader.autotune["batches_per_s"]
