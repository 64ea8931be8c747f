"""Architecture search (PaddleSlim's ``paddleslim.nas``): simulated annealing over the tokens of
a search space (:mod:`~paddlejax.slim.nas.annealing`)."""
