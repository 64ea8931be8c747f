"""Structured pruning on programs: channel dependency groups from the op traits
(:mod:`~paddlejax.slim.prune.groups`) and :func:`prune` (:mod:`~paddlejax.slim.prune.pruner`)."""
from paddlejax.slim.prune.groups import ChannelGraph, Group
from paddlejax.slim.prune.pruner import CRITERIA, channel_scores, prune

__all__ = ["ChannelGraph", "Group", "prune", "channel_scores", "CRITERIA"]
