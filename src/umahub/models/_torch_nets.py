"""The zoo's architectures in PyTorch, parameter names equal to the zoo's weight names.

Imported only by :mod:`umahub.models.torch_zoo`, and only once PyTorch is
known to be installed. Batch norm is already folded (convs carry a bias), as
in the Relax models, so the two compute the same function on the same weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from . import bert, cnn, mlp, mobilenet, resnet


class MLP(nn.Module):
    """See :mod:`umahub.models.mlp`."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(mlp.IN_FEATURES, mlp.HIDDEN)
        self.fc2 = nn.Linear(mlp.HIDDEN, mlp.CLASSES)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(nn.Module):
    """See :mod:`umahub.models.cnn`."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(cnn.CHANNELS, cnn.WIDTH, 3, padding=1)
        self.conv2 = nn.Conv2d(cnn.WIDTH, cnn.WIDTH, 3, padding=1)
        self.fc = nn.Linear(cnn.WIDTH * cnn.SIZE * cnn.SIZE, cnn.CLASSES)

    def forward(self, x):
        h1 = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h1)) + h1
        return self.fc(torch.flatten(h, 1))


class BasicBlock(nn.Module):
    """A ResNet basic block with batch norm folded."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Conv2d(c_in, c_out, 1, stride=stride)

    def forward(self, x):
        h = self.conv2(F.relu(self.conv1(x)))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(h + shortcut)


class ResNet18(nn.Module):
    """See :mod:`umahub.models.resnet`."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: dict[str, list[nn.Module]] = {}
        for prefix, c_in, c_out, stride in resnet._blocks():
            stages.setdefault(prefix.split(".")[0], []).append(BasicBlock(c_in, c_out, stride))
        for stage, blocks in stages.items():
            setattr(self, stage, nn.Sequential(*blocks))
        self.fc = nn.Linear(512, resnet.CLASSES)

    def forward(self, x):
        h = self.maxpool(F.relu(self.conv1(x)))
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(h.mean(dim=(2, 3)))


class InvertedResidual(nn.Module):
    """A MobileNetV2 block with batch norm folded."""

    def __init__(self, c_in: int, hidden: int, c_out: int, stride: int):
        super().__init__()
        self.expand = nn.Conv2d(c_in, hidden, 1) if hidden != c_in else None
        self.dw = nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden)
        self.project = nn.Conv2d(hidden, c_out, 1)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x):
        h = x if self.expand is None else F.relu6(self.expand(x))
        h = self.project(F.relu6(self.dw(h)))
        return h + x if self.residual else h


class MobileNetV2(nn.Module):
    """See :mod:`umahub.models.mobilenet`."""

    def __init__(self):
        super().__init__()
        blocks = [InvertedResidual(*b[1:]) for b in mobilenet._blocks()]
        stem = nn.Conv2d(3, mobilenet.STEM, 3, stride=2, padding=1)
        last = nn.Conv2d(320, mobilenet.LAST, 1)
        self.features = nn.ModuleList([stem, *blocks, last])
        self.classifier = nn.Linear(mobilenet.LAST, mobilenet.CLASSES)

    def forward(self, x):
        stem, *blocks, last = self.features
        h = F.relu6(stem(x))
        for block in blocks:
            h = block(h)
        h = F.relu6(last(h))
        return self.classifier(h.mean(dim=(2, 3)))


class EncoderLayer(nn.Module):
    """One post-norm BERT encoder layer."""

    def __init__(self):
        super().__init__()
        for name in ("query", "key", "value", "attn_out"):
            setattr(self, name, nn.Linear(bert.HIDDEN, bert.HIDDEN))
        self.attn_norm = nn.LayerNorm(bert.HIDDEN, eps=bert.LN_EPS)
        self.ffn_in = nn.Linear(bert.HIDDEN, bert.INTERMEDIATE)
        self.ffn_out = nn.Linear(bert.INTERMEDIATE, bert.HIDDEN)
        self.ffn_norm = nn.LayerNorm(bert.HIDDEN, eps=bert.LN_EPS)

    def _heads(self, x):
        return x.reshape(1, bert.SEQ, bert.HEADS, bert.HEAD_DIM).permute(0, 2, 1, 3)

    def forward(self, x, mask):
        q, k, v = (self._heads(f(x)) for f in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(bert.HEAD_DIM) + mask
        ctx = (scores.softmax(dim=-1) @ v).permute(0, 2, 1, 3).reshape(1, bert.SEQ, bert.HIDDEN)
        h = self.attn_norm(self.attn_out(ctx) + x)
        return self.ffn_norm(self.ffn_out(F.gelu(self.ffn_in(h))) + h)


class Bert(nn.Module):
    """See :mod:`umahub.models.bert`."""

    def __init__(self, layers: int):
        super().__init__()
        self.layer = nn.ModuleList(EncoderLayer() for _ in range(layers))

    def forward(self, hidden_states, attention_mask):
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_mask)
        return hidden_states


CONSTRUCTORS = {
    "mlp": MLP,
    "cnn": CNN,
    "resnet18": ResNet18,
    "mobilenetv2": MobileNetV2,
    "bert": lambda: Bert(1),
    "bert2": lambda: Bert(2),
}
