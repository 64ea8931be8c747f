"""Structured pruning on programs: channel dependency groups from the op traits
(:mod:`~paddlejax.slim.pruning.groups`), :func:`prune` (:mod:`~paddlejax.slim.pruning.pruner`),
sensitivity analysis (:mod:`~paddlejax.slim.pruning.sensitive`) and the simulated-annealing
:class:`AutoPruner` (:mod:`~paddlejax.slim.pruning.auto`), and a picture of the groups
(:func:`plot_groups`). ``pj.slim.prune`` is :func:`prune`."""
from paddlejax.slim.pruning.auto import AutoPruner, SearchResult
from paddlejax.slim.pruning.groups import ChannelGraph, Group
from paddlejax.slim.pruning.pruner import CRITERIA, channel_scores, prune
from paddlejax.slim.pruning.plot import plot_groups
from paddlejax.slim.pruning.sensitive import get_ratios_by_loss, plot_sensitivity, prune_by_sensitivity, sensitivity

__all__ = ["ChannelGraph", "Group", "prune", "channel_scores", "CRITERIA", "sensitivity", "get_ratios_by_loss",
           "plot_sensitivity", "prune_by_sensitivity", "plot_groups", "AutoPruner", "SearchResult"]
