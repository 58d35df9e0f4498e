"""Plain ``nn.Module`` building blocks usable as graph nodes, by name for recipes (``MODELS``).

``blocks`` holds the generic ones, ``recurrent`` the original's recurrent models, ``cnn`` its encoder-decoder CNN,
``capsule`` its capsule network, ``heads`` the source-separation heads.
"""

from __future__ import annotations

from torch import nn

from .blocks import BLSTM, Concat, Constant, Dense, FeedForward, Linear, MeanPool
from .capsule import CapsNet, DBRCapsNet
from .cnn import EncoderDecoderCNN
from .heads import Attractor, DeepClusteringHead, MaskHead
from .recurrent import BRNN, LeakyBLSTM, ResetBLSTM, ResetBLSTMInsert

# Model types by name, for recipes: ``type = "BLSTM"`` plus its settings.
MODELS: dict[str, type[nn.Module]] = {
    "BLSTM": BLSTM, "FeedForward": FeedForward, "Linear": Linear, "Dense": Dense, "MeanPool": MeanPool,
    "Concat": Concat, "ResetBLSTM": ResetBLSTM,
    "ResetBLSTMInsert": ResetBLSTMInsert, "LeakyBLSTM": LeakyBLSTM, "BRNN": BRNN,
    "DeepClusteringHead": DeepClusteringHead, "MaskHead": MaskHead, "Constant": Constant, "Attractor": Attractor,
    "EncoderDecoderCNN": EncoderDecoderCNN, "CapsNet": CapsNet,
    "DBRCapsNet": DBRCapsNet,
}


def build_model(type_name: str, **settings: object) -> nn.Module:
    """``build_model("BLSTM", input_dim=129, hidden=64)``; unknown types list the valid ones."""
    from ..base.registry import build

    return build("model", MODELS, type_name, settings)


__all__ = ["Attractor", "BLSTM", "BRNN", "CapsNet", "Concat", "Constant", "DBRCapsNet", "DeepClusteringHead",
           "Dense", "EncoderDecoderCNN", "FeedForward", "LeakyBLSTM", "Linear", "MODELS", "MaskHead", "MeanPool",
           "ResetBLSTM", "ResetBLSTMInsert", "build_model"]
