"""The model zoo (``paddlejax.models``), on :mod:`paddlejax.nn`.

Image classification (Paddle's ``paddle.vision.models`` and PaddleClas variants): ResNet
18/34/50/101/152 in the vb, vc and vd variants, ResNeXt50_32x4d, SE-ResNeXt50_32x4d,
MobileNetV1/V2 with width multipliers, VGG11-19; text: BERT/ERNIE encoders with heads and a
Hugging Face checkpoint loader, WordPiece tokenisation, pretrained all-MiniLM-L6-v2 sentence
embeddings, the Transformer encoder-decoder with greedy and beam search, and the PaddingRNN
LSTM/GRU language model; click-through rate: Wide & Deep and DeepFM over hashed, sharded
embedding tables; graphs: the GCN, GAT and GraphSAGE node classifiers; video: TSM on
ResNet-18/50; generative: conditional DCGAN with spectral norm, Pix2Pix and CycleGAN, with their
objectives. Every model traces to a program (``pj.to_static``) and takes ``pretrained=PATH``
(a local safetensors file; nothing is downloaded).

>>> import paddlejax as pj
>>> from flax import nnx
>>> model = nnx.eval_shape(lambda: pj.models.resnet50())   # shapes only, nothing allocated
>>> sum(p.size for _, p in nnx.state(model, nnx.Param).flat_state())
25557032
"""
from paddlejax.models.bert import (BertConfig, BertForSequenceClassification, BertForTokenClassification, BertModel,
                                   SentenceEmbedding, load_hf_bert)
from paddlejax.models.ctr import DeepFM, WideDeep
from paddlejax.models.digits import DigitsCNN
from paddlejax.models.gan import (CycleGANGenerator, DCGANDiscriminator, DCGANGenerator, PatchGANDiscriminator,
                                  Pix2PixGenerator)
from paddlejax.models.gan_objectives import CycleGANObjective, DCGANObjective, Pix2PixObjective, gan_loss
from paddlejax.models.gnn import GAT, GCN, GraphSAGE
from paddlejax.models.minilm import SentenceEncoder, all_minilm_l6_v2, all_minilm_l6_v2_classifier
from paddlejax.models.mobilenet import MobileNetV1, MobileNetV2, mobilenet_v1, mobilenet_v2
from paddlejax.models.resnet import (ResNet, resnet18, resnet34, resnet50, resnet101, resnet152, resnext50_32x4d,
                                     se_resnext50_32x4d)
from paddlejax.models.rnnlm import RNNLM, lm_batches, lm_loss, padding_rnn
from paddlejax.models.tokenizer import BertTokenizer
from paddlejax.models.tsm import TSM, tsm_resnet18, tsm_resnet50
from paddlejax.models.transformer import CrossEntropyCriterion, Transformer, transformer_base, transformer_big
from paddlejax.models.vgg import VGG, vgg11, vgg13, vgg16, vgg19
from paddlejax.models.yolov3 import YOLOv3, evaluate_map, yolov3_darknet53, yolov3_tiny

__all__ = [
    "ResNet", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "se_resnext50_32x4d",
    "MobileNetV1", "MobileNetV2", "mobilenet_v1", "mobilenet_v2", "VGG", "vgg11", "vgg13", "vgg16", "vgg19",
    "DigitsCNN", "BertConfig", "BertModel", "BertForSequenceClassification", "BertForTokenClassification",
    "SentenceEmbedding", "load_hf_bert", "BertTokenizer", "SentenceEncoder", "all_minilm_l6_v2",
    "all_minilm_l6_v2_classifier", "Transformer", "transformer_base", "transformer_big", "CrossEntropyCriterion",
    "RNNLM", "padding_rnn", "lm_loss", "lm_batches", "WideDeep", "DeepFM", "GCN", "GAT", "GraphSAGE",
    "TSM", "tsm_resnet18", "tsm_resnet50",
    "DCGANGenerator", "DCGANDiscriminator", "Pix2PixGenerator", "PatchGANDiscriminator", "CycleGANGenerator",
    "DCGANObjective", "Pix2PixObjective", "CycleGANObjective", "gan_loss",
    "YOLOv3", "yolov3_darknet53", "yolov3_tiny", "evaluate_map",
]
