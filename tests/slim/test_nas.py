"""Architecture search: search spaces, the simulated-annealing controller, SANAS with FLOPs and
latency limits, resuming, the latency table's cache, the training reward and Light-NAS configs."""
import json
import math

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.slim.nas import (SANAS, Annealing, Block, LatencyTable, LightNASStrategy, MobileNetV2Space, ResNetSpace,
                                SAController, SearchSpace, light_nas, network_flops, register_search_space,
                                search_space, train_and_score)
from paddlejax.passes.autotune import device_kind
from paddlejax.slim.nas.latency import LatencyCacheWarning

DIGITS = {"input_size": 8, "output_size": 1, "input_channels": 1, "class_dim": 10}
MOBILENET = [("MobileNetV2Space", {**DIGITS, "block_num": 2})]


def flops_score(nas):
    """A stand-in for training: fewer FLOPs is better, with a token-dependent twist."""
    tokens = nas.current_info()["current_tokens"]
    return -nas.measures()["flops"] / 1e5 + 0.01 * sum(tokens)


def test_mobilenetv2_space_maps_tokens_to_paddles_stages_and_builds_them():
    space = MobileNetV2Space(block_num=2, **DIGITS)
    assert space.range_table() == [5, 5, 5, 3, 2] and space.init_tokens() == [2, 4, 2, 1, 0]
    # head width 12; then expansion 3, width 24, 3 blocks, stride 2, 5x5
    assert space.stages([1, 2, 3, 2, 1]) == [(1, 12, 1, 1, 3), (3, 24, 3, 2, 5)]
    net = space.token2arch([1, 2, 3, 2, 1])
    net.eval()
    assert net(np.zeros((2, 1, 8, 8), np.float32)).shape == (2, 10)
    assert net[2].conv[1][0].weight[...].shape == (36, 1, 5, 5)  # the 5x5 depthwise conv of the 12 -> 24 block
    assert [b.out_shape for b in space.blocks([1, 2, 3, 2, 1])][:5] == [(16, 4, 4), (12, 4, 4), (24, 2, 2),
                                                                        (24, 2, 2), (24, 2, 2)]
    with pytest.raises(ValueError, match="token 3 is 3, outside 0..2"):
        space.token2arch([1, 2, 3, 3, 1])
    # block_num 5 and 6 add an unstrided stage each, as Paddle's do
    assert len(MobileNetV2Space(block_num=5, **DIGITS).range_table()) == 1 + 5 * 4
    assert len(MobileNetV2Space(block_num=6, **DIGITS).range_table()) == 1 + 7 * 4


def test_resnet_space_and_feature_map_outputs():
    space = ResNetSpace(block_num=2, **DIGITS)
    assert space.range_table() == [3, 3, 3, 3]
    widths = [b.kwargs.get("out_channels") for b in space.blocks([2, 0, 1, 2])]
    assert widths == [24, 24, 24, 24, 24, 10]  # stem, 1 block of 24, 3 blocks of 24, classifier
    features = ResNetSpace(input_size=8, output_size=2, block_num=2, input_channels=1).token2arch([0, 0, 0, 0])
    features.eval()
    assert features(np.zeros((1, 1, 8, 8), np.float32)).shape == (1, 16, 2, 2)
    with pytest.raises(ValueError, match="output_size 3 must be 1 .* or input_size / 2 \\*\\* block_num = 2"):
        ResNetSpace(input_size=8, output_size=3, block_num=2)


def test_spaces_are_registered_by_name_and_combined():
    @register_search_space
    class OneConvSpace(SearchSpace):
        def init_tokens(self):
            return [0]

        def range_table(self):
            return [2]

        def blocks(self, tokens):
            return [Block.of("conv_bn", self.in_shape, out_channels=4 * (1 + tokens[0]), kernel=3, stride=2)]

    try:
        both = search_space([("OneConvSpace", {"input_size": 8, "output_size": 4, "block_num": 1}),
                             ("ResNetSpace", {**DIGITS, "block_num": 1})])
        assert both.range_table() == [2, 3, 3] and both.init_tokens() == [0, 1, 0]
        conv, resnet = both.token2arch([1, 0, 0])
        assert conv[0][0].weight[...].shape == (8, 3, 3, 3) and len(resnet) == 3
        with pytest.raises(KeyError, match="no search space 'Nope'; registered: .*'OneConvSpace'"):
            search_space([("Nope", {})])
    finally:
        del pj.slim.nas.SEARCH_SPACES["OneConvSpace"]


def test_a_worse_reward_is_accepted_with_probability_exp_of_the_drop_over_the_temperature():
    accepted = 0
    for seed in range(2000):
        search = Annealing(init_temperature=1.0, reduce_rate=0.5, seed=seed)
        search.update([0], 1.0)            # step 0; the next step's temperature is 0.5
        accepted += search.update([1], 0.5)
    assert abs(accepted / 2000 - math.exp(-0.5 / 0.5)) < 0.03
    assert Annealing().temperature == 100 and Annealing(reduce_rate=0.85).reduce_rate == 0.85


def test_the_controller_changes_one_token_within_its_range_and_is_seeded():
    ranges = [6, 1, 5, 4]

    def run(seed):
        sa = SAController(ranges, init_tokens=[0, 0, 4, 1], seed=seed)
        proposals, rewards = [], []
        for step in range(12):
            tokens = sa.next_tokens()
            current = sa.annealing.state["current"]
            if current is not None:  # after the first: exactly one token differs, within its range
                assert sum(a != b for a, b in zip(tokens, current)) == 1, (tokens, current)
            assert all(0 <= t < n for t, n in zip(tokens, ranges)) and tokens[1] == 0
            proposals.append(tokens)
            rewards.append(-abs(tokens[0] - 2) - abs(tokens[2] - 1) - step * 1e-3)
            sa.update(tokens, rewards[-1])
        assert sa.max_reward == max(rewards) and sa.best_tokens == proposals[int(np.argmax(rewards))]
        return proposals

    first = run(seed=5)
    assert first[0] == [0, 0, 4, 1] and len({tuple(p) for p in first}) == 12  # new tokens while there are some
    assert run(seed=5) == first and run(seed=6) != first


def test_the_controller_resamples_a_bounded_number_of_times():
    calls = []

    def at_most_one(tokens):
        calls.append(tokens)
        return sum(tokens) <= 1

    sa = SAController([5, 5], init_temperature=1e-3, init_tokens=[1, 0], constrain_func=at_most_one, max_try_times=20)
    sa.update(sa.next_tokens(), 1.0)
    assert sa.next_tokens() == [0, 0]  # the one new neighbour of [1, 0] within the limit
    assert not sa.update([0, 0], -100.0)  # rejected: the search stays at [1, 0]
    assert sa.next_tokens() == [0, 0]  # no new neighbour fits: one proposed before is scored again

    exactly_one = SAController([5, 5], init_tokens=[1, 0], constrain_func=lambda t: calls.append(t) or sum(t) == 1,
                               max_try_times=20)
    exactly_one.update(exactly_one.next_tokens(), 1.0)
    calls.clear()
    with pytest.raises(RuntimeError, match="none of 20 proposals around \\[1, 0\\] meets the constraints"):
        exactly_one.next_tokens()
    assert len(calls) == 20
    with pytest.raises(ValueError, match="token 1 is 5, outside 0..4"):
        SAController([5, 5], init_tokens=[0, 5])


def test_sanas_keeps_every_network_within_the_flops_limit_and_starts_from_a_feasible_one():
    space = search_space(MOBILENET)
    init_flops = network_flops(space, space.init_tokens())
    limit = init_flops // 2
    nas = SANAS(MOBILENET, search_steps=3, seed=1, flops=limit)
    start = nas.controller.init_tokens
    assert start != space.init_tokens() and network_flops(space, start) <= limit  # walked under the limit
    nas.search(lambda archs: flops_score(nas))
    assert [h["step"] for h in nas.history] == [1, 2, 3]
    assert nas.history[0]["tokens"] == start
    assert all(h["flops"] <= limit for h in nas.history)
    assert all(network_flops(space, h["tokens"]) == h["flops"] for h in nas.history)
    info = nas.current_info()
    assert info["best_reward"] == max(h["reward"] for h in nas.history)
    assert info["current_tokens"] == nas.history[-1]["tokens"]
    with pytest.raises(RuntimeError, match="all 3 search steps are done"):
        nas.next_archs()
    with pytest.raises(RuntimeError, match="no tokens within the constraints in 10 steps from .*raise the limits"):
        SANAS(MOBILENET, flops=1000, max_try_times=10)


def test_sanas_resumes_from_its_checkpoint_with_the_same_sequence(tmp_path):
    options = dict(search_steps=5, seed=3, flops=150_000, init_temperature=0.05)
    straight = SANAS(MOBILENET, **options)
    straight.search(lambda archs: flops_score(straight))

    path = tmp_path / "sanas.json"
    first = SANAS(MOBILENET, save_checkpoint=path, **options)
    for _ in range(3):
        first.next_archs()
        first.reward(flops_score(first))
    saved = json.loads(path.read_text())
    assert saved["format"] == "paddlejax-sanas" and len(saved["records"]) == 3
    resumed = SANAS(MOBILENET, save_checkpoint=path, load_checkpoint=path, **options)
    assert resumed.step == 3
    resumed.search(lambda archs: flops_score(resumed))
    assert resumed.history == straight.history
    assert resumed.current_info() == straight.current_info()
    assert any(not h["accepted"] for h in straight.history)  # the sequence includes a rejected step

    with pytest.raises(ValueError, match="is the search of .*ResNetSpace"):
        SANAS([("ResNetSpace", {**DIGITS, "block_num": 1})], load_checkpoint=path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot resume from"):
        SANAS(MOBILENET, load_checkpoint=path)


def test_sanas_runs_in_this_process_only():
    SANAS(MOBILENET, server_addr=("127.0.0.1", 9999), search_steps=1)  # local: accepted, port ignored
    with pytest.raises(ValueError, match="names another machine"):
        SANAS(MOBILENET, server_addr=("10.1.2.3", 8881))
    with pytest.raises(ValueError, match="is_server=False .* not supported"):
        SANAS(MOBILENET, is_server=False)
    nas = SANAS(MOBILENET, search_steps=1)
    with pytest.raises(RuntimeError, match="call next_archs"):
        nas.reward(1.0)


def test_rewards_are_logged_and_plotted(tmp_path, caplog):
    nas = SANAS(MOBILENET, search_steps=2, seed=0)
    with caplog.at_level("INFO", logger="paddlejax.slim.nas"):
        nas.search(lambda archs: flops_score(nas))
    assert sum("reward" in r.getMessage() for r in caplog.records) == 2
    assert nas.plot_rewards(str(tmp_path / "rewards.png")) == str(tmp_path / "rewards.png")
    assert (tmp_path / "rewards.png").stat().st_size > 1000


TINY = [Block.of("conv_bn", (1, 8, 8), out_channels=4, kernel=3, stride=2),
        Block.of("classifier", (4, 4, 4), out_channels=10)]


def test_the_latency_table_measures_each_block_once_and_reuses_its_file(tmp_path):
    path = tmp_path / "latency.json"
    table = LatencyTable(path, batch_size=2, repeats=2)
    predicted = table.predict(TINY + TINY)
    assert table.measured == 2 and predicted == 2 * sum(table.block_ms(b) for b in TINY)
    data = json.loads(path.read_text())
    entry = next(iter(data["entries"].values()))
    assert data["format"] == "paddlejax-latency" and entry["device"] == device_kind() and entry["batch_size"] == 2
    again = LatencyTable(path, batch_size=2, repeats=2)
    assert again.predict(TINY) == table.predict(TINY) and again.measured == 0  # nothing timed the second time
    other_batch = LatencyTable(path, batch_size=4, repeats=2)
    other_batch.predict(TINY[:1])
    assert other_batch.measured == 1  # the batch size is part of the key


def test_a_corrupt_latency_table_is_rebuilt_with_a_warning(tmp_path):
    path = tmp_path / "latency.json"
    path.write_bytes(b"\x80\x04\x95 a pickle, or garbage")
    with pytest.warns(LatencyCacheWarning, match="is not valid JSON"):
        table = LatencyTable(path, batch_size=2, repeats=2)
    table.predict(TINY)
    assert table.measured == 2 and len(json.loads(path.read_text())["entries"]) == 2

    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["ms"] = -1.0
    path.write_text(json.dumps(data))
    with pytest.warns(LatencyCacheWarning, match="does not match its key; measuring it again"):
        LatencyTable(path, batch_size=2, repeats=2).predict(TINY)

    path.write_text(json.dumps({"someone": "else's file"}))
    with pytest.warns(LatencyCacheWarning, match="left untouched"):
        LatencyTable(path, batch_size=2, repeats=2).predict(TINY)
    assert json.loads(path.read_text()) == {"someone": "else's file"}


def test_sanas_under_a_latency_limit_predicts_from_the_table(tmp_path):
    table = LatencyTable(tmp_path / "latency.json", batch_size=2, repeats=2)
    space = search_space(MOBILENET)
    limit = 1.5 * table.predict(space.blocks(space.init_tokens()))
    nas = SANAS(MOBILENET, search_steps=2, seed=0, latency=limit, latency_table=table)
    nas.search(lambda archs: flops_score(nas))
    assert all(h["latency_ms"] <= limit for h in nas.history)
    assert all(h["latency_ms"] == table.predict(space.blocks(h["tokens"])) for h in nas.history)
    measured = table.measured
    SANAS(MOBILENET, search_steps=2, seed=0, latency=limit,
          latency_table=LatencyTable(table.path, batch_size=2, repeats=2)).search(lambda archs: 0.0)
    assert table.measured == measured


def test_train_and_score_trains_on_a_validation_split_of_the_training_data():
    digits = pj.data.Digits("train")
    pj.nn.seed(0)
    model = search_space([("ResNetSpace", {**DIGITS, "block_num": 1})]).token2arch([0, 0])[0]
    score = train_and_score(model, digits, epochs=3)
    assert 0.6 < score <= 1.0  # 3 epochs on 80 % of the training split; scored on the other 20 %
    pj.nn.seed(0)
    again = search_space([("ResNetSpace", {**DIGITS, "block_num": 1})]).token2arch([0, 0])[0]
    assert train_and_score(again, digits, epochs=3) == score  # seeded: the same split, order and score
    with pytest.raises(ValueError, match="refusing the test split"):
        train_and_score(model, pj.data.Digits("test"), epochs=1)


LIGHT_NAS = {
    "controllers": {"sa_controller": {"class": "SAController", "reduce_rate": 0.85, "init_temperature": 10.24,
                                      "max_iter_number": 300}},
    "strategies": {"light_nas_strategy": {"class": "LightNASStrategy", "controller": "sa_controller",
                                          "target_flops": 150_000, "target_latency": 0, "end_epoch": 500,
                                          "retrain_epoch": 5, "metric_name": "acc_top1", "server_ip": "",
                                          "server_port": 8871, "is_server": True, "search_steps": 100},
                   "uniform": {"class": "UniformPruneStrategy", "target_ratio": 0.5}},
}


def test_light_nas_reads_paddleslim_1x_compress_configs(tmp_path):
    nas = light_nas(LIGHT_NAS, MOBILENET, seed=0)
    assert (nas.search_steps, nas.controller.max_try_times, [str(c) for c in nas.constraints]) == \
        (100, 300, ["flops <= 150000"])
    assert nas.controller.annealing.init_temperature == 10.24 and nas.controller.annealing.reduce_rate == 0.85
    strategy = LightNASStrategy.from_config(LIGHT_NAS)
    assert strategy.retrain_epoch == 5 and strategy.metric_name == "acc_top1"

    def with_strategy(**changes):
        config = json.loads(json.dumps(LIGHT_NAS))
        config["strategies"]["light_nas_strategy"].update(changes)
        return config

    assert light_nas(with_strategy(search_steps=None), MOBILENET).search_steps == 500 // 5
    inline = {"light_nas": {"controller": {"max_iter_number": 7}, "target_flops": 0, "target_latency": 2.5}}
    by_latency = light_nas(inline, MOBILENET, latency_table=LatencyTable(tmp_path / "latency.json", batch_size=1))
    assert [str(c) for c in by_latency.constraints] == ["latency_ms <= 2.5"]
    assert by_latency.controller.max_try_times == 7
    bad = json.loads(json.dumps(LIGHT_NAS))
    bad["controllers"]["sa_controller"]["max_iter"] = 3
    with pytest.raises(ValueError, match="unknown key 'max_iter' in controllers.sa_controller"):
        light_nas(bad, MOBILENET)
    with pytest.raises(ValueError, match="unknown key 'start_epochs' in strategies.light_nas_strategy"):
        light_nas(with_strategy(start_epochs=0), MOBILENET)
    with pytest.raises(ValueError, match="names controller 'nope', which controllers does not define"):
        light_nas(with_strategy(controller="nope"), MOBILENET)
    with pytest.raises(ValueError, match="is_server=False"):
        light_nas(with_strategy(is_server=False), MOBILENET)
    with pytest.raises(ValueError, match="names another machine"):
        light_nas(with_strategy(server_ip="192.168.0.7"), MOBILENET)
    with pytest.raises(ValueError, match="retrain_epoch of strategies.light_nas_strategy expects an int >= 1"):
        light_nas(with_strategy(retrain_epoch=0), MOBILENET)
    with pytest.raises(ValueError, match="unknown key 'version' in the config"):
        light_nas({**LIGHT_NAS, "version": 1.0}, MOBILENET)
