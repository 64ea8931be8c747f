"""Training: the Trainer, its typed state, the step builders of the strategies, metrics,
callbacks, loss scaling and checkpoints; the GANTrainer for two-player training.

>>> import paddlejax as pj
>>> pj.train.Trainer is pj.Trainer
True
"""
from paddlejax.train import metrics  # noqa: F401
from paddlejax.train.callbacks import BestModel, Callback, EarlyStopping, LambdaCallback  # noqa: F401
from paddlejax.train.gan import GANTrainer, sample_grid  # noqa: F401
from paddlejax.train.history import History, PlotCurves, TensorBoard  # noqa: F401
from paddlejax.train.loss_scale import LossScale  # noqa: F401
from paddlejax.train.metrics import Accuracy, Auc, Metric, Perplexity, Precision, Recall  # noqa: F401
from paddlejax.train.state import TrainState  # noqa: F401
from paddlejax.train.trainer import Trainer  # noqa: F401
