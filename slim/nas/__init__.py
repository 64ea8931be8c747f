"""Architecture search (PaddleSlim's ``paddleslim.nas``): :class:`SANAS`, simulated annealing
over the tokens of a search space, under FLOPs or measured-latency limits.

- search spaces (:mod:`~paddlejax.slim.nas.search_space`): :class:`MobileNetV2Space`,
  :class:`ResNetSpace`, and a registry for more (:func:`register_search_space`);
- the controller (:class:`SAController`) and the annealing it shares with the auto pruner
  (:mod:`~paddlejax.slim.nas.annealing`);
- limits (:class:`Constraint`): FLOPs of the traced network, or latency predicted by a
  per-block :class:`LatencyTable` measured on this device and cached on disk;
- the reward of a short training on a validation split (:func:`train_and_score`);
- Light-NAS's 2019 config (:func:`light_nas`, :class:`LightNASStrategy`).

>>> import paddlejax as pj
>>> from paddlejax.slim.nas import SANAS, train_and_score
>>> space = ("MobileNetV2Space", {"input_size": 8, "output_size": 1, "block_num": 1, "input_channels": 1,
...                               "class_dim": 10})
>>> nas = SANAS([space], search_steps=2, seed=0)
>>> info = nas.search(lambda archs: -nas.measures()["flops"])   # or: train_and_score(archs[0], digits, 1)
>>> nas.step, len(info["best_tokens"])
(2, 1)
"""
from paddlejax.slim.nas.annealing import Annealing
from paddlejax.slim.nas.constraints import Constraint, network_flops
from paddlejax.slim.nas.controller import SAController
from paddlejax.slim.nas.latency import LatencyTable, measure_latency
from paddlejax.slim.nas.light_nas import LightNASStrategy, light_nas
from paddlejax.slim.nas.mobilenetv2_space import MobileNetV2Space
from paddlejax.slim.nas.resnet_space import ResNetSpace
from paddlejax.slim.nas.reward import train_and_score
from paddlejax.slim.nas.sa_nas import SANAS, plot_rewards
from paddlejax.slim.nas.search_space import (BLOCKS, SEARCH_SPACES, Block, CombinedSearchSpace, SearchSpace,
                                             register_block, register_search_space, search_space)

__all__ = ["SANAS", "SAController", "Annealing", "SearchSpace", "CombinedSearchSpace", "MobileNetV2Space",
           "ResNetSpace", "Block", "BLOCKS", "SEARCH_SPACES", "register_block", "register_search_space",
           "search_space", "Constraint", "network_flops", "LatencyTable", "measure_latency", "train_and_score",
           "plot_rewards", "LightNASStrategy", "light_nas"]
