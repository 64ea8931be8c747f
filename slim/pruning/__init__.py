"""Structured pruning on programs: channel dependency groups from the op traits
(:mod:`~paddlejax.slim.pruning.groups`), :func:`prune` (:mod:`~paddlejax.slim.pruning.pruner`),
sensitivity analysis (:mod:`~paddlejax.slim.pruning.sensitive`) and the simulated-annealing
:class:`AutoPruner` (:mod:`~paddlejax.slim.pruning.auto`). ``pj.slim.prune`` is :func:`prune`."""
from paddlejax.slim.pruning.auto import AutoPruner, SearchResult
from paddlejax.slim.pruning.groups import ChannelGraph, Group
from paddlejax.slim.pruning.pruner import CRITERIA, channel_scores, prune
from paddlejax.slim.pruning.sensitive import get_ratios_by_loss, plot_sensitivity, sensitivity

__all__ = ["ChannelGraph", "Group", "prune", "channel_scores", "CRITERIA", "sensitivity", "get_ratios_by_loss",
           "plot_sensitivity", "AutoPruner", "SearchResult"]
